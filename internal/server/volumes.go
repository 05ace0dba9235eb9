package server

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/fleetauth"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume/content"
)

// volumeForwarder serves a replica's volume content requests (their token
// checked by the API) from the node that holds the volume, over the
// fleet's mutual TLS; a volume no sandbox mounted yet is put on a ready
// node first (its row's nodeID, set once: a create racing it keeps
// whichever won).
func volumeForwarder(st store.Store, reg *registry, fleet *fleetauth.Fleet, log *slog.Logger) func(http.ResponseWriter, *http.Request, store.Volume) {
	return func(w http.ResponseWriter, r *http.Request, v store.Volume) {
		if v.NodeID == "" {
			ready := reg.IDs()
			slices.Sort(ready)
			if len(ready) == 0 {
				content.Fail(w, content.StatusError(http.StatusServiceUnavailable, "no node is ready to hold the volume"))
				return
			}
			got, err := st.UpdateVolume(r.Context(), "", v.ID, func(x *store.Volume) error {
				if x.NodeID == "" {
					x.NodeID = ready[0]
				}
				return nil
			})
			if err != nil {
				status := http.StatusServiceUnavailable
				if errdefs.IsNotFound(err) {
					status = http.StatusNotFound
				}
				content.Fail(w, content.StatusError(status, "volume "+v.ID+": "+err.Error()))
				return
			}
			v = got
		}
		addr := reg.hop(v.NodeID)
		if addr == "" {
			content.Fail(w, content.StatusError(http.StatusServiceUnavailable, "the node that holds volume "+v.Name+" ("+v.NodeID+") is not reachable now; retry later"))
			return
		}
		rp := &httputil.ReverseProxy{
			Transport: reg.hopTransport(addr),
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme, pr.Out.URL.Host = fleet.Scheme(), addr
				pr.Out.Header.Del("Authorization") // the volume's token stays here
				pr.Out.Header.Set(content.SizeHeader, strconv.FormatInt(v.SizeBytes, 10))
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				log.Warn("volume content: the node did not answer", "volume_id", v.ID, "node_id", v.NodeID, "err", err)
				content.Fail(w, content.StatusError(http.StatusBadGateway, "the node that holds the volume did not answer"))
			},
		}
		rp.ServeHTTP(w, r)
	}
}
