// Package proxy routes in-sandbox traffic (envd on 49983, the code
// interpreter on 49999, any user port) from the API's listener to the
// sandbox: by the E2b-Sandbox-Id / E2b-Sandbox-Port headers, by Host
// "{port}-{sandboxID}.{domain}", or, for a presigned /files URL, by the
// sandbox whose token signed it. Responses stream as they come. Unknown,
// paused or killed sandboxes get a JSON 502.
package proxy

import (
	"context"
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
	"time"

	"github.com/spore-run/spore/internal/ids"
)

// Resolver finds where a sandbox's traffic goes.
type Resolver interface {
	// Lookup returns the sandbox's address, whether it can take traffic
	// now (running), and a channel closed when that instance goes away.
	Lookup(id string) (addr netip.Addr, running, found bool, gone <-chan struct{})
	// SignedBy returns the sandbox whose access token signed a presigned
	// /files URL.
	SignedBy(q url.Values, op string) (string, bool)
}

// DefaultPort is envd's.
const DefaultPort = 49983

// Proxy is the in-sandbox traffic handler.
type Proxy struct {
	res Resolver
	log *slog.Logger
	rp  *httputil.ReverseProxy

	// One transport per live instance: when the instance goes, its pooled
	// connections go with it (its network is gone; they would sit idle,
	// holding a descriptor, two goroutines and their buffers, until a
	// timeout).
	mu         sync.Mutex
	transports map[netip.Addr]*http.Transport
}

type ctxKey struct{}

type target struct {
	addr netip.Addr
	port int
	gone <-chan struct{}
}

// New returns the proxy.
func New(res Resolver, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{res: res, log: log, transports: map[netip.Addr]*http.Transport{}}
	p.rp = &httputil.ReverseProxy{
		Transport:     roundTripper{p},
		FlushInterval: -1, // flush every write: streams must not wait in a buffer
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ctxKey{}).(target)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort(t.addr.String(), strconv.Itoa(t.port))
			pr.Out.Host = pr.Out.URL.Host
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			p.log.Debug("proxy", "err", err)
			writeError(w, http.StatusBadGateway, "sandbox unreachable: "+err.Error())
		},
	}
	return p
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
	return rt.p.transport(t.addr, t.gone).RoundTrip(r)
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
	var id string
	var port int
	var err error
	if r.Header.Get("E2b-Sandbox-Id") == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" &&
		!hostNamesSandbox(r.Host) {
		op := "read"
		if r.Method == http.MethodPost {
			op = "write"
		}
		var ok bool
		if id, ok = p.res.SignedBy(r.URL.Query(), op); !ok {
			writeError(w, http.StatusUnauthorized, "the signature matches no sandbox")
			return
		}
		port = DefaultPort
	} else if id, port, err = Route(r); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	addr, running, found, gone := p.res.Lookup(id)
	switch {
	case !found:
		writeError(w, http.StatusBadGateway, "sandbox "+id+" not found")
		return
	case !running:
		writeError(w, http.StatusBadGateway, "sandbox "+id+" is paused: connect to it to resume it")
		return
	}
	// One exchange per client connection: a connection reused after a
	// proxied stream was cut at times by the stock SDK's HTTP client under
	// load ("terminated"); a fresh local connection costs ~0.1 ms.
	w.Header().Set("Connection", "close")
	// End the exchange when the instance goes away (killed, hibernated,
	// rolled back): its network is gone and would never answer.
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), ctxKey{}, target{addr: addr, port: port, gone: gone}))
	defer cancel()
	go func() {
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

func hostNamesSandbox(host string) bool {
	label, _, _ := strings.Cut(host, ".")
	ps, rest, ok := strings.Cut(label, "-")
	return ok && rest != "" && strings.Trim(ps, "0123456789") == "" && ps != ""
}
