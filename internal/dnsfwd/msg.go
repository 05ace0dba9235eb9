package dnsfwd

import (
	"encoding/binary"
	"errors"
	"strings"
)

// The little of the DNS wire format (RFC 1035 §4.1) the forwarder needs:
// it passes messages through untouched and only answers by itself to
// refuse or fail, which means echoing the question.

const headerLen = 12

// Response codes.
const (
	RcodeSuccess  = 0
	RcodeServFail = 2
	RcodeNXDomain = 3
	RcodeRefused  = 5
)

var errMalformed = errors.New("malformed DNS message")

// isQuery reports whether msg is a standard query (QR clear, opcode 0)
// with at least a header: anything else is not forwarded (a response sent
// to the forwarder could loop or poison).
func isQuery(msg []byte) bool {
	return len(msg) >= headerLen && msg[2]&0x80 == 0 && (msg[2]>>3)&0x0f == 0
}

// questionEnd returns the offset just past the question section.
func questionEnd(msg []byte) (int, error) {
	if len(msg) < headerLen {
		return 0, errMalformed
	}
	qd := int(binary.BigEndian.Uint16(msg[4:6]))
	off := headerLen
	for range qd {
		end, err := skipName(msg, off)
		if err != nil {
			return 0, err
		}
		off = end + 4 // type, class
		if off > len(msg) {
			return 0, errMalformed
		}
	}
	return off, nil
}

// skipName returns the offset past the (possibly compressed) name at off.
func skipName(msg []byte, off int) (int, error) {
	for {
		if off >= len(msg) {
			return 0, errMalformed
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xc0 == 0xc0: // pointer: the name ends here
			if off+2 > len(msg) {
				return 0, errMalformed
			}
			return off + 2, nil
		case l&0xc0 != 0:
			return 0, errMalformed
		}
		off += 1 + l
	}
}

// Reply builds an answer to query with no records and rcode: the
// query's ID, opcode, RD bit and question, QR and RA set. A query whose
// question cannot be read gets the header alone.
func Reply(query []byte, rcode int) []byte {
	if len(query) < headerLen {
		return nil
	}
	end, err := questionEnd(query)
	qd := binary.BigEndian.Uint16(query[4:6])
	if err != nil {
		end, qd = headerLen, 0
	}
	out := make([]byte, end)
	copy(out, query[:end])
	out[2] = 0x80 | query[2]&0x79 // QR, opcode and RD kept, AA and TC cleared
	out[3] = 0x80 | byte(rcode&0x0f)
	binary.BigEndian.PutUint16(out[4:6], qd)
	clear(out[6:12]) // no answer, authority or additional records
	return out
}

// Question returns the first question's name (lower case, no trailing
// dot) and type; ok is false when there is none or it is compressed.
func Question(msg []byte) (name string, qtype uint16, ok bool) {
	if len(msg) < headerLen || binary.BigEndian.Uint16(msg[4:6]) == 0 {
		return "", 0, false
	}
	var labels []string
	off := headerLen
	for {
		if off >= len(msg) {
			return "", 0, false
		}
		l := int(msg[off])
		if l == 0 {
			off++
			break
		}
		if l&0xc0 != 0 || off+1+l > len(msg) {
			return "", 0, false
		}
		labels = append(labels, strings.ToLower(string(msg[off+1:off+1+l])))
		off += 1 + l
	}
	if off+4 > len(msg) {
		return "", 0, false
	}
	return strings.Join(labels, "."), binary.BigEndian.Uint16(msg[off : off+2]), true
}

// Query builds a standard recursive query for name and qtype (tests and
// probes).
func Query(id uint16, name string, qtype uint16) []byte {
	msg := make([]byte, headerLen, headerLen+len(name)+6)
	binary.BigEndian.PutUint16(msg[0:2], id)
	msg[2] = 0x01 // RD
	binary.BigEndian.PutUint16(msg[4:6], 1)
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		msg = append(msg, byte(len(l)))
		msg = append(msg, l...)
	}
	msg = append(msg, 0, byte(qtype>>8), byte(qtype), 0, 1) // class IN
	return msg
}

// Rcode returns a message's response code.
func Rcode(msg []byte) int {
	if len(msg) < headerLen {
		return -1
	}
	return int(msg[3] & 0x0f)
}

// ID returns a message's ID.
func ID(msg []byte) uint16 {
	if len(msg) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(msg)
}
