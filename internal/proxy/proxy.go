// Package proxy routes in-sandbox traffic (envd on 49983, the code
// interpreter on 49999, any user port) from the API's listener to the
// sandbox: by the E2b-Sandbox-Id / E2b-Sandbox-Port headers, by Host
// "{port}-{sandboxID}.{domain}", or, for a presigned /files URL, by the
// sandbox whose token signed it. Responses stream as they come. Unknown,
// paused or killed sandboxes get a JSON 502.
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

	// hop carries traffic to node-side proxies (see Hopper).
	hopToken string
	hop      *http.Transport
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
	p := &Proxy{res: res, isKey: isKey, log: log, transports: map[netip.Addr]*http.Transport{}}
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
				pr.Out.URL.Host = t.via
				pr.Out.Header.Set("E2b-Sandbox-Id", t.id)
				pr.Out.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
				pr.Out.Header.Set(ClusterTokenHeader, p.hopToken)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			t := r.Context().Value(ctxKey{}).(target)
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
		return rt.p.hop.RoundTrip(r)
	}
	return rt.p.transport(t.addr, t.gone).RoundTrip(r)
}

// WithHop lets the proxy reach sandboxes on other hosts through their
// node's proxy (when its Resolver is a Hopper), presenting the cluster
// token there.
func (p *Proxy) WithHop(clusterToken string) *Proxy {
	p.hopToken = clusterToken
	p.hop = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		ReadBufferSize:      64 << 10,
		WriteBufferSize:     64 << 10,
		DisableCompression:  true,
	}
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
	var id string
	var port int
	var err error
	if r.Header.Get("E2b-Sandbox-Id") == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" &&
		!hostNamesSandbox(r.Host) {
		op := "read"
		if r.Method == http.MethodPost {
			op = "write"
		}
		var serr error
		if id, serr = p.res.SignedBy(r.Context(), r.URL.Query(), op); serr != nil {
			switch {
			case errors.Is(serr, errdefs.ErrResourceLimit):
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusTooManyRequests, serr.Error())
			case errors.Is(serr, errdefs.ErrUnavailable):
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, "presigned URL check: temporarily unavailable, retry later")
			default:
				writeError(w, http.StatusUnauthorized, "the signature matches no sandbox")
			}
			return
		}
		port = DefaultPort
	} else if id, port, err = Route(r); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var via string
	var addr netip.Addr
	var running, found bool
	var gone <-chan struct{}
	lookup := func() {
		if h, ok := p.res.(Hopper); ok && p.hop != nil {
			via, addr, running, found, gone = h.LookupVia(id)
		} else {
			addr, running, found, gone = p.res.Lookup(id)
		}
	}
	lookup()
	if !running {
		if wk, ok := p.res.(Waker); ok {
			// Traffic resumes a sandbox created with autoResume.
			if woken, err := wk.Wake(r.Context(), id); err != nil {
				eid := newErrorID()
				p.log.Warn("proxy: resume on traffic failed", "error_id", eid, "sandbox_id", id, "err", err)
				writeError(w, http.StatusBadGateway, "sandbox "+id+" could not be resumed (error id "+eid+")")
				return
			} else if woken {
				lookup()
			}
		}
	}
	switch {
	case !found:
		p.refuse(w, id, port, "sandbox "+id+" not found")
		return
	case !running:
		p.refuse(w, id, port, "sandbox "+id+" is paused: connect to it to resume it")
		return
	}
	if !p.portOpen(r, id, port) {
		writeError(w, http.StatusForbidden, "sandbox "+id+"'s ports take requests only with its traffic access token (header E2B-Traffic-Access-Token)")
		return
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
	// End the exchange when the instance goes away (killed, hibernated,
	// rolled back): its network is gone and would never answer.
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), ctxKey{}, target{id: id, addr: addr, port: port, gone: gone, via: via}))
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
