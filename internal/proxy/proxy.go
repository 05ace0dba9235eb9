// Package proxy routes in-sandbox traffic (envd on 49983, the code
// interpreter on 49999, any user port) from the API's listener to the
// sandbox: by the E2b-Sandbox-Id / E2b-Sandbox-Port headers, by Host
// "{port}-{sandboxID}.{domain}", or, for a presigned /files URL, by the
// sandbox whose token signed it. Responses stream as they come. Unknown,
// paused or killed sandboxes get a JSON 502; one being paused or
// hibernated on its node, a 503 that the replica in front retries
// (replay.go).
package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Resolver finds where a sandbox's traffic goes.
type Resolver interface {
	// Lookup returns the sandbox's address, whether it can take traffic
	// now (running), and a channel closed when that instance goes away.
	Lookup(id string) (addr netip.Addr, running, found bool, gone <-chan struct{})
	// SignedBy returns the sandbox whose access token signed a presigned
	// /files URL: an errdefs.ErrNotFound when none did,
	// ErrResourceLimit when the caller should retry later; bounded, and
	// cancelled with ctx (the request's).
	SignedBy(ctx context.Context, q url.Values, op string) (string, error)
	// TrafficAllowed checks a sandbox's traffic access token (E2B's
	// E2B-Traffic-Access-Token) and returns its envd access token.
	TrafficAllowed(ctx context.Context, id, trafficToken string) (accessToken string, ok bool)
}

// Hopper is a Resolver whose sandboxes may run on other hosts (an API
// replica of a fleet): via is the address (host:port) of the node-side
// proxy in front of the sandbox, "" when addr is dialed directly.
type Hopper interface {
	LookupVia(id string) (via string, addr netip.Addr, running, found bool, gone <-chan struct{})
}

// ClusterTokenHeader carries the cluster token on the hop from an API
// replica to a node's proxy (Authorization belongs to the sandbox's own
// protocols). The node's proxy checks it and removes it; it never enters
// a sandbox.
const ClusterTokenHeader = "Spore-Cluster-Token"

// TransitionHeader marks a node-side proxy's 503 for a sandbox being
// paused or hibernated there: the request never entered the sandbox, so
// the replica in front may send it again once the sandbox has moved
// (forwardReplaying). The node's proxy removes it from what sandboxes
// answer.
const TransitionHeader = "Spore-Sandbox-Transition"

// DefaultPort is envd's.
const DefaultPort = 49983

// InterpreterPort is the code interpreter's. The stock code-interpreter
// SDK sends envd's X-Access-Token to it only with /execute; its /contexts
// calls carry the traffic access token instead, which the proxy checks and
// exchanges for the access token the interpreter requires.
const InterpreterPort = 49999

const trafficHeader = "E2b-Traffic-Access-Token"

// KeyCheck reports whether a credential is one of Spore's API keys.
type KeyCheck func(ctx context.Context, key string) bool

// Proxy is the in-sandbox traffic handler.
type Proxy struct {
	res   Resolver
	isKey KeyCheck
	log   *slog.Logger
	rp    *httputil.ReverseProxy

	// One transport per live instance: when the instance goes, its pooled
	// connections go with it (its network is gone; they would sit idle,
	// holding a descriptor, two goroutines and their buffers, until a
	// timeout).
	mu         sync.Mutex
	transports map[netip.Addr]*http.Transport

	// nodeSide: this is a node's proxy behind an API replica (AsNodeSide).
	nodeSide bool
	// q: what a node-side proxy forwards to each sandbox, and which take
	// nothing new (quiesce.go); under mu.
	q quiesce
	// hop carries traffic to node-side proxies (see Hopper): the
	// transport to the node behind a via address, and the scheme.
	hop       func(via string) http.RoundTripper
	hopScheme string
	// replayFor bounds how long a request is sent again to a sandbox in
	// transition on its node (forwardReplaying).
	replayFor time.Duration
	// viaGoneGrace: how long an exchange through a node's proxy outlives
	// its instance (forward).
	viaGoneGrace time.Duration

	totals totals
}

type ctxKey struct{}

type target struct {
	id   string
	addr netip.Addr
	port int
	gone <-chan struct{}
	via  string // node-side proxy, or "" (direct)
}

// New returns the proxy. isKey recognizes Spore's API keys, so that one
// sent as "Authorization: Bearer" never reaches a sandbox; nil treats every
// Bearer credential as one (none passes).
func New(res Resolver, isKey KeyCheck, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if isKey == nil {
		isKey = func(context.Context, string) bool { return true }
	}
	p := &Proxy{res: res, isKey: isKey, log: log, transports: map[netip.Addr]*http.Transport{}, replayFor: defaultReplayFor, viaGoneGrace: defaultViaGoneGrace,
		q: quiesce{inflight: map[string]int{}, marked: map[string]time.Time{}, idle: map[string]chan struct{}{}}}
	p.rp = &httputil.ReverseProxy{
		Transport:     roundTripper{p},
		FlushInterval: -1, // flush every write: streams must not wait in a buffer
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ctxKey{}).(target)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort(t.addr.String(), strconv.Itoa(t.port))
			pr.Out.Host = pr.Out.URL.Host
			p.stripCredentials(pr.In.Context(), pr.Out.Header)
			p.exchangeTrafficToken(pr.In.Context(), t, pr.In.Header, pr.Out.Header)
			pr.Out.Header.Del(ClusterTokenHeader)
			if t.via != "" {
				// The node's proxy routes by the same headers, to the
				// sandbox's address on that node.
				pr.Out.URL.Scheme, pr.Out.URL.Host = p.hopScheme, t.via
				pr.Out.Header.Set("E2b-Sandbox-Id", t.id)
				pr.Out.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			if p.nodeSide {
				// Only this proxy says a sandbox is in transition: a
				// sandbox's own answer saying so would have the replica
				// replay a request the sandbox already took.
				resp.Header.Del(TransitionHeader)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(ctxKey{}).(target)
			if errors.Is(context.Cause(r.Context()), errInstanceGone) {
				// Before it answered: an answer must still go out (none
				// was an empty 200, which the SDKs misread: "unsupported
				// content type null"). Not a 503: the request may have
				// run there.
				p.log.Info("proxy: sandbox went away before it answered", "sandbox_id", t.id, "port", t.port, "status", http.StatusBadGateway)
				writeError(w, http.StatusBadGateway, "sandbox "+t.id+" went away (hibernated, paused, killed or rolled back) before it answered: the request may have run there")
				return
			}
			if errors.Is(err, context.Canceled) {
				return // the client went
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				p.refuse(w, t.id, t.port, fmt.Sprintf("nothing listens on port %d in the sandbox", t.port))
				return
			}
			// The error names the sandbox's internal address: log it under
			// an ID, answer with the ID.
			id := newErrorID()
			p.log.Warn("proxy: sandbox unreachable", "error_id", id, "port", t.port, "err", err)
			writeError(w, http.StatusBadGateway, "sandbox unreachable (error id "+id+")")
		},
	}
	return p
}

// stripCredentials removes what authenticates a client to Spore from a
// request about to enter a sandbox, where untrusted code could read it:
// X-API-Key always, and each Authorization value that carries an API key
// (as a Bearer token or bare). What the sandbox's own protocols need stays:
// X-Access-Token (envd's token), Authorization: Basic (envd's user
// selection) and any other Authorization, which a user's app on its own
// port may expect. The routing headers go too: they mean nothing inside.
func (p *Proxy) stripCredentials(ctx context.Context, h http.Header) {
	h.Del("X-Api-Key")
	h.Del("E2b-Sandbox-Id")
	h.Del("E2b-Sandbox-Port")
	vals := h.Values("Authorization")
	if len(vals) == 0 {
		return
	}
	keep := vals[:0:0]
	for _, v := range vals {
		if !p.carriesKey(ctx, v) {
			keep = append(keep, v)
		}
	}
	h.Del("Authorization")
	for _, v := range keep {
		h.Add("Authorization", v)
	}
}

// exchangeTrafficToken presents the sandbox's access token to its code
// interpreter when the client proved itself with the sandbox's traffic
// token and sent no access token of its own. The traffic token never
// enters the sandbox.
func (p *Proxy) exchangeTrafficToken(ctx context.Context, t target, in, out http.Header) {
	out.Del(trafficHeader)
	tt := in.Get(trafficHeader)
	if t.port != InterpreterPort || tt == "" || out.Get("X-Access-Token") != "" {
		return
	}
	if tok, ok := p.res.TrafficAllowed(ctx, t.id, tt); ok {
		out.Set("X-Access-Token", tok)
	}
}

// carriesKey reports whether an Authorization value holds an API key.
func (p *Proxy) carriesKey(ctx context.Context, v string) bool {
	v = strings.TrimSpace(v)
	scheme, cred, ok := strings.Cut(v, " ")
	if ok && strings.EqualFold(scheme, "Basic") {
		return false // envd's user selection (base64 "user:"); never a key
	}
	if ok && strings.EqualFold(scheme, "Bearer") {
		v = strings.TrimSpace(cred)
	}
	return v != "" && p.isKey(ctx, v)
}

func newErrorID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// refuse answers 502 for a sandbox the proxy cannot reach, and logs it:
// clients (the stock SDKs) report any 502 as "sandbox not running", so
// the log is where the reason is kept.
func (p *Proxy) refuse(w http.ResponseWriter, id string, port int, msg string) {
	p.log.Info("proxy: refused", "sandbox_id", id, "port", port, "status", http.StatusBadGateway, "reason", msg)
	writeError(w, http.StatusBadGateway, msg)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// Route extracts the sandbox and port a request is for.
func Route(r *http.Request) (id string, port int, err error) {
	if id = r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port = DefaultPort
		if ps := r.Header.Get("E2b-Sandbox-Port"); ps != "" {
			if port, err = parsePort(ps); err != nil {
				return "", 0, err
			}
		}
	} else {
		host := r.Host
		if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
			host = h
		}
		label, _, _ := strings.Cut(host, ".")
		ps, rest, ok := strings.Cut(label, "-")
		if !ok {
			return "", 0, fmt.Errorf("no sandbox named in the request")
		}
		if port, err = parsePort(ps); err != nil {
			return "", 0, err
		}
		id = rest
	}
	if err := ids.Validate("sandbox ID", id); err != nil {
		return "", 0, err
	}
	return id, port, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("sandbox port %q is not a port number", s)
	}
	return p, nil
}

type roundTripper struct{ p *Proxy }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	t := r.Context().Value(ctxKey{}).(target)
	if t.via != "" {
		return rt.p.hop(t.via).RoundTrip(r)
	}
	return rt.p.transport(t.addr, t.gone).RoundTrip(r)
}

// AsNodeSide marks the proxy as a node's, behind an API replica that
// looked the sandbox up as running: one found here not running is in a
// transition (pausing, hibernating), answered 503 with Retry-After, not
// the 502 of a sandbox that is not there. A node-side proxy counts the
// requests it forwards to each sandbox, for Quiesce.
func (p *Proxy) AsNodeSide() *Proxy {
	p.nodeSide = true
	return p
}

// WithHop lets the proxy reach sandboxes on other hosts (when its
// Resolver is a Hopper) through their node's proxy at a via address, with
// the transport hop gives for it (the fleet's: mutual TLS that checks it
// reached that node, or, insecure, the cluster token in
// ClusterTokenHeader) and scheme ("https", or "http" when insecure).
func (p *Proxy) WithHop(hop func(via string) http.RoundTripper, scheme string) *Proxy {
	p.hop, p.hopScheme = hop, scheme
	return p
}

// transport returns the instance's transport, creating it (and the
// goroutine that closes it when the instance goes) on first use.
func (p *Proxy) transport(addr netip.Addr, gone <-chan struct{}) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tr, ok := p.transports[addr]; ok {
		return tr
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // streams (commands, watches) may wait long for headers
		ReadBufferSize:        64 << 10,
		WriteBufferSize:       64 << 10,
		DisableCompression:    true,
	}
	p.transports[addr] = tr
	go func() {
		<-gone
		p.mu.Lock()
		if p.transports[addr] == tr {
			delete(p.transports, addr)
		}
		p.mu.Unlock()
		tr.CloseIdleConnections()
	}()
	return tr
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{ResponseWriter: w}
	var body *countingBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingBody{ReadCloser: r.Body}
		r.Body = body
	}
	forwarded := p.serve(cw, r)
	var in int64
	if body != nil {
		in = body.n.Load()
	}
	p.totals.add(cw.status, forwarded, in, cw.n)
}

// serve is ServeHTTP's work; it reports whether the request was sent on.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) (forwarded bool) {
	id, port, ok := p.route(w, r)
	if !ok {
		return false
	}
	t, ref := p.resolve(r.Context(), id, port)
	if ref != nil {
		ref.write(p, w)
		return false
	}
	if p.nodeSide {
		if !p.admit(id) {
			// A drain readies its hibernation (Quiesce): nothing new.
			(&refusal{id: id, port: port, status: http.StatusServiceUnavailable, transition: true,
				msg: "sandbox " + id + " is being hibernated: retry"}).write(p, w)
			return false
		}
		defer p.release(id)
	}
	if !p.portOpen(r, id, port) {
		writeError(w, http.StatusForbidden, "sandbox "+id+"'s ports take requests only with its traffic access token (header E2B-Traffic-Access-Token)")
		return false
	}
	// The request body belongs to the transport forwarding it. Without
	// full duplex, net/http's server, when the response headers go out on a
	// keep-alive HTTP/1.1 connection, drains and closes the request body
	// itself (to ready the connection for the next request), racing the
	// transport still reading it: the transport's last read (the EOF probe
	// after Content-Length bytes) got "http: invalid Read on closed Body",
	// closed the connection to the sandbox and cut the response mid-stream
	// (the stock SDK's "terminated", under CPU load; a response that
	// starts before the body is complete deadlocked instead). See
	// docs/reliability.md "Keep-alive through the proxy". (HTTP/2 is full
	// duplex anyway: an error here changes nothing.)
	http.NewResponseController(w).EnableFullDuplex()
	if t.via != "" {
		body, ok, err := replayable(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
			return false
		}
		if ok {
			p.forwardReplaying(w, r, t, body)
			return true
		}
	}
	p.forward(w, r, t)
	return true
}

// route finds the sandbox and port a request is for (a presigned /files
// URL names its sandbox by its signature), or answers the request.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request) (id string, port int, ok bool) {
	if r.Header.Get("E2b-Sandbox-Id") == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" &&
		!hostNamesSandbox(r.Host) {
		op := "read"
		if r.Method == http.MethodPost {
			op = "write"
		}
		id, err := p.res.SignedBy(r.Context(), r.URL.Query(), op)
		if err != nil {
			switch {
			case errors.Is(err, errdefs.ErrResourceLimit):
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusTooManyRequests, err.Error())
			case errors.Is(err, errdefs.ErrUnavailable):
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, "presigned URL check: temporarily unavailable, retry later")
			default:
				writeError(w, http.StatusUnauthorized, "the signature matches no sandbox")
			}
			return "", 0, false
		}
		return id, DefaultPort, true
	}
	id, port, err := Route(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", 0, false
	}
	return id, port, true
}

// refusal is the proxy's own answer to a request it does not forward.
type refusal struct {
	status int
	msg    string
	// transition: a node-side answer for a sandbox being paused or
	// hibernated (503, Retry-After, TransitionHeader).
	transition bool
	// wakeErr: resuming the sandbox (autoResume) failed with this.
	wakeErr error
	id      string
	port    int
}

func (f *refusal) write(p *Proxy, w http.ResponseWriter) {
	switch {
	case f.wakeErr != nil:
		eid := newErrorID()
		p.log.Warn("proxy: resume on traffic failed", "error_id", eid, "sandbox_id", f.id, "err", f.wakeErr)
		writeError(w, http.StatusBadGateway, "sandbox "+f.id+" could not be resumed (error id "+eid+")")
	case f.transition:
		p.log.Info("proxy: sandbox in transition", "sandbox_id", f.id, "port", f.port, "status", http.StatusServiceUnavailable)
		w.Header().Set("Retry-After", "1")
		w.Header().Set(TransitionHeader, "1")
		writeError(w, http.StatusServiceUnavailable, f.msg)
	default:
		p.refuse(w, f.id, f.port, f.msg)
	}
}

// resolve looks the sandbox up, resuming it first if it is paused or
// hibernated with autoResume; a sandbox that cannot take the request now
// gets a refusal instead of a target.
func (p *Proxy) resolve(ctx context.Context, id string, port int) (target, *refusal) {
	var t target
	var running, found bool
	lookup := func() {
		t = target{id: id, port: port}
		if h, ok := p.res.(Hopper); ok && p.hop != nil {
			t.via, t.addr, running, found, t.gone = h.LookupVia(id)
		} else {
			t.addr, running, found, t.gone = p.res.Lookup(id)
		}
	}
	lookup()
	if !running {
		if wk, ok := p.res.(Waker); ok {
			// Traffic resumes a sandbox created with autoResume.
			if woken, err := wk.Wake(ctx, id); err != nil {
				return t, &refusal{id: id, port: port, wakeErr: err}
			} else if woken {
				lookup()
			}
		}
	}
	switch {
	case !found && p.nodeSide:
		// The replica in front found the sandbox running on this node:
		// it is no longer here (its hibernation or move ended before the
		// replica's row caught up), and the request was not forwarded.
		// Like a transition: the replica looks it up again and sends the
		// request where the sandbox is now, or answers as its row says.
		return t, &refusal{id: id, port: port, status: http.StatusServiceUnavailable, transition: true,
			msg: "sandbox " + id + " is not on this node (hibernated, moved or gone): retry"}
	case !found:
		return t, &refusal{id: id, port: port, status: http.StatusBadGateway, msg: "sandbox " + id + " not found"}
	case !running && p.nodeSide:
		// The replica in front found the sandbox running: here it is
		// not, so it is being paused or hibernated (a drain, the reaper,
		// memory pressure) or resumed. The request was not forwarded: the
		// replica retries it (forwardReplaying), or the client does after
		// Retry-After; a sandbox hibernated with autoResume wakes at the
		// retry's lookup.
		return t, &refusal{id: id, port: port, status: http.StatusServiceUnavailable, transition: true,
			msg: "sandbox " + id + " is being paused or hibernated: retry"}
	case !running:
		return t, &refusal{id: id, port: port, status: http.StatusBadGateway, msg: "sandbox " + id + " is paused: connect to it to resume it"}
	}
	return t, nil
}

// forward sends the request to the sandbox (or its node's proxy) and the
// answer back, ending the exchange when the instance goes away (killed,
// hibernated, rolled back): its network is gone and would never answer.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t target) {
	ctx, cancel := context.WithCancelCause(context.WithValue(r.Context(), ctxKey{}, t))
	defer cancel(nil)
	go func() {
		select {
		case <-t.gone:
		case <-ctx.Done():
			return
		}
		if t.via != "" {
			// The node's proxy sees the instance go on its node and ends
			// the exchange itself, with the answer that says whether the
			// request entered the sandbox (502, went away) or never did
			// (503 in transition, which forwardReplaying sends again).
			// Ending it here at once lost that answer: a request that
			// reached node 1 while a drain hibernated its sandbox got a
			// 502 when the row changed (TestRollingUpgrade). The replica
			// ends it itself only when the node does not answer within
			// viaGoneGrace (a node lost with its sandboxes).
			tm := time.NewTimer(p.viaGoneGrace)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-ctx.Done():
				return
			}
		}
		cancel(errInstanceGone)
	}()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// defaultViaGoneGrace bounds how long a replica waits for a node's proxy
// to end an exchange whose sandbox instance went away (forward).
const defaultViaGoneGrace = 10 * time.Second

// errInstanceGone ends an exchange whose sandbox instance went away.
var errInstanceGone = errors.New("the sandbox's instance went away")

// Waker is a Resolver that can resume a paused or hibernated sandbox
// created with autoResume when traffic for it arrives.
type Waker interface {
	Wake(ctx context.Context, id string) (woken bool, err error)
}

// Private is a Resolver that knows which sandboxes keep their ports
// private (E2B's allowPublicTraffic false).
type Private interface {
	PrivateTraffic(ctx context.Context, id string) bool
}

// portOpen says whether a request may reach port of sandbox id: envd's and
// the code interpreter's ports check their own tokens; a private
// sandbox's other ports need its traffic access token, which is then
// removed before the request enters the sandbox (exchangeTrafficToken).
func (p *Proxy) portOpen(r *http.Request, id string, port int) bool {
	if port == DefaultPort || port == InterpreterPort {
		return true
	}
	pr, ok := p.res.(Private)
	if !ok || !pr.PrivateTraffic(r.Context(), id) {
		return true
	}
	_, ok = p.res.TrafficAllowed(r.Context(), id, r.Header.Get(trafficHeader))
	return ok
}

func hostNamesSandbox(host string) bool {
	label, _, _ := strings.Cut(host, ".")
	ps, rest, ok := strings.Cut(label, "-")
	return ok && rest != "" && strings.Trim(ps, "0123456789") == "" && ps != ""
}
