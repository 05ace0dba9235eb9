package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// A request an API replica forwards to a sandbox on another node goes
// through that node's proxy, which answers 503 with TransitionHeader when
// the sandbox is no longer running there although the replica's row said
// it was: it is being paused or hibernated (a drain, the reaper, memory
// pressure). That request never entered the sandbox, so the replica sends
// it again, once the sandbox's row has caught up: an autoResume sandbox
// a drain hibernated then wakes on another node at the lookup, and the
// request goes there. Without this the client got the 503, which the
// stock SDKs do not retry: on a command's stream (envd's Start) they
// report it as "Sandbox is probably not running anymore", the same as a
// sandbox that is gone (TestRollingUpgrade's errors of kind (1)).
//
// Only requests the replica can send again are held: a body of known
// length up to replayMax (read before the first try), no protocol
// upgrade. Others get the 503 as before; so does one whose sandbox is
// still in transition after replayFor.

// replayMax bounds the body a replica keeps to send a request again.
const replayMax = 64 << 10

// defaultReplayFor bounds how long a replica keeps sending a request again
// to a sandbox in transition (a hibernation, then a resume elsewhere).
const defaultReplayFor = 30 * time.Second

// replayable reads the request's body when the request can be sent again
// (see above); ok false leaves the body unread.
func replayable(r *http.Request) (body []byte, ok bool, err error) {
	if r.Header.Get("Upgrade") != "" || r.ContentLength < 0 || r.ContentLength > replayMax {
		return nil, false, nil
	}
	if r.ContentLength == 0 {
		return nil, true, nil
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, r.ContentLength+1))
	if err == nil && int64(len(body)) != r.ContentLength {
		err = fmt.Errorf("%d bytes, Content-Length says %d", len(body), r.ContentLength)
	}
	if err != nil {
		return nil, false, err
	}
	return body, true, nil
}

// forwardReplaying forwards a replayable request through a node's proxy
// (t.via), and again while that proxy answers that the sandbox is in
// transition, looking the sandbox up (and waking it) again before each
// try, within replayFor. What the client gets is the first answer that
// is not a transition, or the refusal the sandbox earns then (killed:
// 502), or the last transition 503 when time is up.
func (p *Proxy) forwardReplaying(w http.ResponseWriter, r *http.Request, t target, body []byte) {
	ctx := r.Context()
	deadline := time.Now().Add(p.replayFor)
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		c := &transitionCatcher{w: w, hdr: http.Header{}}
		in := r.WithContext(ctx)
		in.Body, in.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		if len(body) == 0 {
			in.Body = http.NoBody
		}
		p.forward(c, in, t)
		if !c.caught() || ctx.Err() != nil {
			return
		}
		var ref *refusal
		for {
			if time.Now().After(deadline) || sleepCtx(ctx, wait) != nil {
				p.log.Info("proxy: sandbox still in transition on its node, the client gets the 503", "sandbox_id", t.id, "port", t.port, "tries", try)
				c.release()
				return
			}
			wait = min(2*wait, time.Second)
			if t, ref = p.resolve(ctx, t.id, t.port); ref == nil || !ref.worthWaiting() {
				break
			}
		}
		if ref != nil {
			ref.write(p, w)
			return
		}
		p.log.Info("proxy: sandbox was in transition on its node, sending the request again", "sandbox_id", t.id, "port", t.port, "try", try+1, "via", t.via)
	}
}

// worthWaiting says whether a refusal met while sending a request again
// may end on its own: a resume refused for now (its image not durable
// yet on a draining node, or a store or node briefly unavailable).
func (f *refusal) worthWaiting() bool {
	return f.wakeErr != nil && (errors.Is(f.wakeErr, errdefs.ErrResourceLimit) || errors.Is(f.wakeErr, errdefs.ErrUnavailable))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// transitionCatcher is the ResponseWriter of one try: it keeps a node
// proxy's transition answer from the client (caught) and passes any
// other answer through as it comes.
type transitionCatcher struct {
	w       http.ResponseWriter
	hdr     http.Header // the answer's headers until it is passed on
	status  int         // the transition answer caught, or 0
	body    bytes.Buffer
	passing bool // the answer goes to the client
}

func (c *transitionCatcher) caught() bool { return c.status != 0 }

func (c *transitionCatcher) Header() http.Header {
	if c.passing {
		return c.w.Header()
	}
	return c.hdr
}

func (c *transitionCatcher) WriteHeader(code int) {
	switch {
	case c.passing:
		c.w.WriteHeader(code)
	case c.caught():
	case code == http.StatusServiceUnavailable && c.hdr.Get(TransitionHeader) != "":
		c.status = code
	case code < http.StatusOK: // informational: passed on, the answer is yet to come
		h := c.w.Header()
		for k, v := range c.hdr {
			h[k] = v
		}
		c.w.WriteHeader(code)
		for k := range c.hdr {
			h.Del(k)
		}
	default:
		h := c.w.Header()
		for k, v := range c.hdr {
			h[k] = v
		}
		c.passing = true
		c.w.WriteHeader(code)
	}
}

func (c *transitionCatcher) Write(b []byte) (int, error) {
	if c.caught() {
		if room := 4096 - c.body.Len(); room > 0 {
			c.body.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	if !c.passing {
		c.WriteHeader(http.StatusOK)
	}
	return c.w.Write(b)
}

// FlushError flushes what is passed on; nothing, before the answer is.
func (c *transitionCatcher) FlushError() error {
	if !c.passing {
		return nil
	}
	return http.NewResponseController(c.w).Flush()
}

func (c *transitionCatcher) Unwrap() http.ResponseWriter { return c.w }

// release gives the client the transition answer caught.
func (c *transitionCatcher) release() {
	h := c.w.Header()
	for k, v := range c.hdr {
		h[k] = v
	}
	c.w.WriteHeader(c.status)
	c.w.Write(c.body.Bytes())
}
