package chunk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// PeerPath is where a node serves its cached chunks: GET PeerPath+<64 hex>.
const PeerPath = "/internal/chunks/"

// Handler serves chunks from a node's cache to its peers, and nothing
// else: no store reads on a peer's behalf, so a node's load from peers is
// bounded by what it already holds. It checks no caller: the node serves
// it behind its fleet guard (fleetauth: peers are nodes of the fleet CA,
// or, insecure, holders of the cluster token).
type Handler struct {
	cache *Cache
	log   *slog.Logger
}

// NewHandler returns the peer handler.
func NewHandler(cache *Cache, log *slog.Logger) (*Handler, error) {
	if cache == nil {
		return nil, errdefs.Invalidf("chunk peer handler: no cache")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Handler{cache: cache, log: log}, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// The raw path, so an escaped slash or dot cannot reach the ID; the
	// ID then admits exactly 64 lowercase hex digits.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), PeerPath)
	if !ok {
		http.NotFound(w, r)
		return
	}
	id, err := ParseID(rest)
	if err != nil {
		http.Error(w, "bad chunk id", http.StatusBadRequest)
		return
	}
	frame, err := h.cache.Get(id)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	// Never hand out a copy that would fail the peer's check anyway.
	if _, err := open(id, 0, frame); err != nil {
		h.log.Warn("chunk: corrupt copy in the node cache, dropped", "chunk", id, "err", err)
		h.cache.Drop(id)
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/zstd")
	w.Header().Set("Content-Length", strconv.Itoa(len(frame)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(frame)
}

// Peers fetches chunks from other nodes' Handlers, trying each URL in turn.
type Peers struct {
	// URLs are the peers' base URLs (scheme://host:port).
	URLs []string
	// Client reaches them as a member of the fleet (fleetauth: its TLS
	// or its token); its timeout bounds a fetch (default 30 s).
	Client *http.Client
}

var defaultPeerClient = &http.Client{Timeout: 30 * time.Second}

// Frame implements Source. A chunk no peer has is errdefs.ErrNotFound;
// peers that could not be reached make it errdefs.ErrUnavailable.
func (p *Peers) Frame(ctx context.Context, id ID) ([]byte, error) {
	client := p.Client
	if client == nil {
		client = defaultPeerClient
	} else if client.Timeout == 0 {
		c := *client
		c.Timeout = defaultPeerClient.Timeout
		client = &c
	}
	var errs []error
	unreachable := false
	for _, base := range p.URLs {
		b, err := p.fetch(ctx, client, strings.TrimSuffix(base, "/")+PeerPath+id.String())
		if err == nil {
			return b, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errdefs.IsNotFound(err) {
			unreachable = true
		}
		errs = append(errs, err)
	}
	kind := errdefs.ErrNotFound
	if unreachable {
		kind = errdefs.ErrUnavailable
	}
	return nil, fmt.Errorf("%w: chunk %s from %d peers: %v", kind, id, len(p.URLs), errors.Join(errs...))
}

func (p *Peers) fetch(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, errdefs.Invalidf("peer url %q: %v", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, errdefs.NotFoundf("%s", url)
	default:
		return nil, fmt.Errorf("%w: %s: %s", errdefs.ErrUnavailable, url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxFrame+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, url, err)
	}
	if len(b) > maxFrame {
		return nil, fmt.Errorf("%w: %s: larger than any chunk", errdefs.ErrUnavailable, url)
	}
	return b, nil
}
