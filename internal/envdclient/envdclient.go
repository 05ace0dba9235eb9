// Package envdclient is the host's client of the in-sandbox daemon: the
// calls the node makes itself (health, /init after every restore), and
// Connect-RPC clients for tests and tools.
package envdclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
)

// Client talks to envd daemons over the host's network.
type Client struct {
	http *http.Client
}

// New returns a client with pooled connections.
func New() *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{http: &http.Client{Transport: tr}}
}

// URL is the base URL of a port of the sandbox at addr.
func URL(addr netip.Addr, port int) string {
	return "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(port))
}

// Init re-initialises the daemon at addr after a restore: new identity,
// token and environment. token is the one the daemon holds now (the
// image's).
func (c *Client) Init(ctx context.Context, addr netip.Addr, token string, req envd.InitRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var last error
	for attempt := 0; ; attempt++ {
		r, _ := http.NewRequestWithContext(ctx, http.MethodPost, URL(addr, envd.Port)+"/init", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		// Once per restore: keeping the connection would leave an idle one
		// to every sandbox ever restored (and to dead ones, which never
		// answer a close).
		r.Close = true
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		resp, err := c.http.Do(r)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
			return fmt.Errorf("envd /init at %s: %w: HTTP %d: %s", addr, errdefs.ErrInternal, resp.StatusCode, msg)
		}
		last = err
		// Just restored: the listener may need a moment after its
		// interfaces were re-read.
		select {
		case <-ctx.Done():
			return fmt.Errorf("envd /init at %s: %w: %v", addr, errdefs.ErrUnavailable, last)
		case <-time.After(time.Duration(min(attempt+1, 10)) * 5 * time.Millisecond):
		}
	}
}

// Healthy reports whether the daemon at addr answers /health.
func (c *Client) Healthy(ctx context.Context, addr netip.Addr) bool {
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, URL(addr, envd.Port)+"/health", nil)
	r.Close = true
	resp, err := c.http.Do(r)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}
