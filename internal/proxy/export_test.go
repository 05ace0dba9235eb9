package proxy

import "time"

// SetReplayFor changes how long p sends a request again to a sandbox in
// transition on its node.
func SetReplayFor(p *Proxy, d time.Duration) { p.replayFor = d }

// SetViaGoneGrace changes how long an exchange through a node's proxy
// outlives its sandbox instance.
func SetViaGoneGrace(p *Proxy, d time.Duration) { p.viaGoneGrace = d }
