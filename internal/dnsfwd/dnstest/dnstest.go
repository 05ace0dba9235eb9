// Package dnstest is a tiny authoritative DNS server for tests: A and
// AAAA records from a map, NXDOMAIN for other names, over UDP and TCP.
package dnstest

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/spore-run/spore/internal/dnsfwd"
)

const (
	typeA    = 1
	typeAAAA = 28
)

// Server answers from Names.
type Server struct {
	mu      sync.Mutex
	names   map[string][]netip.Addr
	queries atomic.Int64
	udp     net.PacketConn
	tcp     net.Listener
	wg      sync.WaitGroup
}

// Serve answers on udp and tcp (either may be nil) until Close. Names are
// matched case-insensitively, without a trailing dot.
func Serve(udp net.PacketConn, tcp net.Listener, names map[string]netip.Addr) *Server {
	s := &Server{names: map[string][]netip.Addr{}, udp: udp, tcp: tcp}
	for k, v := range names {
		s.Add(k, v)
	}
	if udp != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 65535)
			for {
				n, from, err := udp.ReadFrom(buf)
				if err != nil {
					return
				}
				udp.WriteTo(s.Answer(buf[:n]), from)
			}
		}()
	}
	if tcp != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				c, err := tcp.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					var l [2]byte
					for {
						if _, err := io.ReadFull(c, l[:]); err != nil {
							return
						}
						q := make([]byte, binary.BigEndian.Uint16(l[:]))
						if _, err := io.ReadFull(c, q); err != nil {
							return
						}
						a := s.Answer(q)
						out := binary.BigEndian.AppendUint16(nil, uint16(len(a)))
						if _, err := c.Write(append(out, a...)); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
	return s
}

// Add gives name one more address (an A or an AAAA record).
func (s *Server) Add(name string, addr netip.Addr) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	s.mu.Lock()
	s.names[name] = append(s.names[name], addr)
	s.mu.Unlock()
}

// Queries is how many queries the server has answered.
func (s *Server) Queries() int64 { return s.queries.Load() }

// Close stops the server.
func (s *Server) Close() {
	if s.udp != nil {
		s.udp.Close()
	}
	if s.tcp != nil {
		s.tcp.Close()
	}
	s.wg.Wait()
}

// Answer builds the answer to one query.
func (s *Server) Answer(q []byte) []byte {
	s.queries.Add(1)
	name, qtype, ok := dnsfwd.Question(q)
	if !ok {
		return dnsfwd.Reply(q, 1) // FORMERR
	}
	s.mu.Lock()
	addrs, known := s.names[name]
	s.mu.Unlock()
	if !known {
		return dnsfwd.Reply(q, dnsfwd.RcodeNXDomain)
	}
	out := dnsfwd.Reply(q, dnsfwd.RcodeSuccess)
	out[2] |= 0x04 // AA
	n := uint16(0)
	for _, addr := range addrs {
		// Records of the type asked for; none when the name has none
		// (it exists, without records of that type).
		if (qtype == typeA && addr.Is4()) || (qtype == typeAAAA && addr.Is6()) {
			a := addr.AsSlice()
			out = append(out, 0xc0, 12, 0, byte(qtype), 0, 1, 0, 0, 0, 60, 0, byte(len(a)))
			out = append(out, a...)
			n++
		}
	}
	binary.BigEndian.PutUint16(out[6:8], n)
	return out
}

// AnswerAddr returns the first A record of an answer.
func AnswerAddr(resp []byte) (netip.Addr, bool) {
	if len(resp) < 12 || binary.BigEndian.Uint16(resp[6:8]) == 0 {
		return netip.Addr{}, false
	}
	// Past the question, the first record: name (pointer or labels),
	// type, class, TTL, length, data.
	off := 12
	for range binary.BigEndian.Uint16(resp[4:6]) {
		off = skip(resp, off) + 4
	}
	off = skip(resp, off)
	if off < 0 || off+10 > len(resp) || binary.BigEndian.Uint16(resp[off:]) != typeA {
		return netip.Addr{}, false
	}
	if binary.BigEndian.Uint16(resp[off+8:]) != 4 || off+14 > len(resp) {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(resp[off+10 : off+14])), true
}

func skip(msg []byte, off int) int {
	for off >= 0 && off < len(msg) {
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1
		case l&0xc0 == 0xc0:
			return off + 2
		}
		off += 1 + l
	}
	return -1
}
