// Package frame is the wire format of the multiplexed edge→object-host query
// transport: many concurrent requests on one long-lived connection, each a
// stream of length-prefixed frames carrying a stream ID, answered in any
// order. The edge (edge/hostframes.go) is the client, the object host
// (objecthost/frames.go) the server; the connection is the host's internal
// HTTP listener's own, switched to this protocol by an HTTP/1.1 Upgrade
// (token Protocol, path UpgradePath) after the listener's mutual TLS and the
// host's role check, so the peer is authenticated exactly as for HTTP.
//
// A frame is a 12-byte header — payload length (uint32, at most
// MaxPayload), type, flags, two reserved zero bytes, stream ID (uint32) —
// then the payload. Integers are big-endian. Per type:
//
//   - Request (client→server, opens stream ID, IDs strictly increasing per
//     connection): body length (uint32), path (uint16 length + bytes), a
//     header block, then the first bytes of the body. FlagEnd: the body is
//     complete.
//   - Data (both ways): more body bytes of the stream. FlagEnd: the last.
//   - Response (server→client): status (uint16), a header block, the first
//     bytes of the answer's body. FlagEnd: the answer is complete.
//   - Reset (both ways): the stream is abandoned (the client: cancelled; the
//     server: the answer could not be completed). Empty payload.
//   - Window (client→server): uint32 more bytes of answer body the server may
//     send on the stream. Each stream starts with InitialWindow; a server
//     never has more than that unacknowledged, so a slow reader of one answer
//     cannot hold the connection or make the client buffer without bound.
//   - GoAway (server→client, stream 0): uint32 last stream ID. The server is
//     closing: streams up to that ID are answered; those above were not and
//     will not be executed (the client may send them again elsewhere).
//
// The server's 101 answer to the upgrade may carry HeaderRoutes, naming
// what it serves on streams beyond the query routes (comma-separated
// tokens; RoutesLifecycle: the batched lifecycle calls POST
// /v1/batch/init and /v1/batch/confirm, their JSON bodies and answers as
// over HTTP). A server of an earlier version sends none, and a client
// sends only the query routes to it (the rest over HTTP), so either side
// may be upgraded first.
//
// A header block is a uint16 count, then per field a uint16 name length,
// the name (an HTTP token), a uint16 value length and the value (no CR, LF
// or NUL). Anything else — an unknown type or flag, an oversized frame, a
// malformed block — is a protocol error: the receiver closes the
// connection.
package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
)

// Protocol constants (version 1).
const (
	// Protocol is the HTTP/1.1 Upgrade token; a server that does not know
	// it answers the upgrade request like any unknown route (404), and the
	// client keeps using HTTP.
	Protocol = "shoal-frames/1"
	// UpgradePath is the request path of the upgrade (GET).
	UpgradePath = "/v1/frames"
	// HeaderRoutes, on the server's 101 answer, lists the routes it serves
	// on streams beyond the query routes.
	HeaderRoutes = "Shoal-Frame-Routes"
	// RoutesLifecycle (in HeaderRoutes): POST /v1/batch/init and
	// /v1/batch/confirm are served on streams.
	RoutesLifecycle = "lifecycle"
	// HeaderLen is the size of a frame header.
	HeaderLen = 12
	// MaxPayload bounds one frame's payload. Bodies longer than a frame
	// are split, so one large request or answer delays the others on the
	// connection by at most one frame.
	MaxPayload = 64 << 10
	// MaxStreams bounds the streams open at once on one connection; a
	// client opens another connection beyond it.
	MaxStreams = 1000
	// InitialWindow is the answer body a server may send on a stream
	// before the client acknowledges any (Window frames).
	InitialWindow = 256 << 10
	// maxHeaders bounds a header block's fields.
	maxHeaders = 64
)

// Type is a frame's type.
type Type uint8

// Frame types.
const (
	TypeRequest  Type = 1
	TypeData     Type = 2
	TypeResponse Type = 3
	TypeReset    Type = 4
	TypeWindow   Type = 5
	TypeGoAway   Type = 6
)

// FlagEnd marks the last frame of a request or answer body.
const FlagEnd uint8 = 1

// ErrProtocol is a peer breaking the protocol: close the connection.
var ErrProtocol = errors.New("frame: protocol error")

func protoErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
}

// Header is a frame's header.
type Header struct {
	Len    uint32
	Type   Type
	Flags  uint8
	Stream uint32
}

// End reports FlagEnd.
func (h Header) End() bool { return h.Flags&FlagEnd != 0 }

// AppendHeader appends h's 12 bytes to b.
func AppendHeader(b []byte, h Header) []byte {
	b = binary.BigEndian.AppendUint32(b, h.Len)
	b = append(b, byte(h.Type), h.Flags, 0, 0)
	return binary.BigEndian.AppendUint32(b, h.Stream)
}

// ParseHeader parses and checks a frame header: known type and flags,
// payload within MaxPayload, stream 0 exactly for GoAway, fixed payload
// sizes of Reset, Window and GoAway.
func ParseHeader(p []byte) (Header, error) {
	if len(p) < HeaderLen {
		return Header{}, protoErr("short header")
	}
	h := Header{Len: binary.BigEndian.Uint32(p), Type: Type(p[4]), Flags: p[5], Stream: binary.BigEndian.Uint32(p[8:])}
	if p[6] != 0 || p[7] != 0 {
		return h, protoErr("reserved bytes set")
	}
	if h.Len > MaxPayload {
		return h, protoErr("frame of %d bytes over the %d limit", h.Len, MaxPayload)
	}
	if h.Type < TypeRequest || h.Type > TypeGoAway {
		return h, protoErr("unknown frame type %d", h.Type)
	}
	if h.Flags&^FlagEnd != 0 {
		return h, protoErr("unknown flags %#x", h.Flags)
	}
	if (h.Stream == 0) != (h.Type == TypeGoAway) {
		return h, protoErr("frame type %d on stream %d", h.Type, h.Stream)
	}
	want := -1
	switch h.Type {
	case TypeReset:
		want = 0
	case TypeWindow, TypeGoAway:
		want = 4
	}
	if want >= 0 && int(h.Len) != want {
		return h, protoErr("frame type %d with %d bytes", h.Type, h.Len)
	}
	if want >= 0 && h.Flags != 0 {
		return h, protoErr("flags on frame type %d", h.Type)
	}
	return h, nil
}

// Reader reads frames from a buffered connection. Not safe for concurrent
// use (one reading goroutine per connection).
type Reader struct {
	br  *bufio.Reader
	buf []byte
}

// NewReader reads frames from br.
func NewReader(br *bufio.Reader) *Reader { return &Reader{br: br} }

// Next reads the next frame. The payload is valid until the next call.
func (r *Reader) Next() (Header, []byte, error) {
	hb, err := r.br.Peek(HeaderLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, nil, err
	}
	h, err := ParseHeader(hb)
	if err != nil {
		return h, nil, err
	}
	_, _ = r.br.Discard(HeaderLen)
	if cap(r.buf) < int(h.Len) {
		r.buf = make([]byte, h.Len, max(int(h.Len), 4096))
	}
	p := r.buf[:h.Len]
	if _, err := io.ReadFull(r.br, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return h, nil, err
	}
	return h, p, nil
}

func appendString16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendHeaderBlock appends hdr as a header block. Fields that cannot be
// carried (over the count or length limits, not a token, a value with CR,
// LF or NUL) are an error, as net/http refuses them.
func AppendHeaderBlock(b []byte, hdr http.Header) ([]byte, error) {
	n := 0
	for _, vs := range hdr {
		n += len(vs)
	}
	if n > maxHeaders {
		return b, fmt.Errorf("frame: %d header fields, at most %d", n, maxHeaders)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	for k, vs := range hdr {
		if !validName(k) {
			return b, fmt.Errorf("frame: invalid header name %q", k)
		}
		for _, v := range vs {
			if len(v) > 0xffff || !validValue(v) {
				return b, fmt.Errorf("frame: invalid value for header %q", k)
			}
			b = appendString16(b, k)
			b = appendString16(b, v)
		}
	}
	return b, nil
}

// parseHeaderBlock parses a header block at the start of p and returns the
// rest of p.
func parseHeaderBlock(p []byte) (http.Header, []byte, error) {
	if len(p) < 2 {
		return nil, nil, protoErr("short header block")
	}
	n := int(binary.BigEndian.Uint16(p))
	if n > maxHeaders {
		return nil, nil, protoErr("%d header fields", n)
	}
	// First the block's extent (every length checked against p), so that
	// one string can hold all of its text: the values (and any name not
	// among the constants of headerName) are substrings of it, not an
	// allocation each.
	end := 2
	for range 2 * n {
		if len(p) < end+2 {
			return nil, nil, protoErr("short string")
		}
		end += 2 + int(binary.BigEndian.Uint16(p[end:]))
		if len(p) < end {
			return nil, nil, protoErr("string past the frame")
		}
	}
	text := string(p[2:end]) // offsets below are into p[2:]
	hdr := make(http.Header, n)
	// One backing array for the values: a field's first value is a
	// one-element slice of it (as net/textproto does), not an allocation.
	vals := make([]string, n)
	off := 0
	next := func() (b []byte, s string) {
		l := int(binary.BigEndian.Uint16(p[2+off:]))
		b, s = p[2+off+2:2+off+2+l], text[off+2:off+2+l]
		off += 2 + l
		return b, s
	}
	for i := range n {
		kb, k := next()
		if c, ok := headerName(kb); ok {
			k = c
		}
		_, v := next()
		if !validName(k) || !validValue(v) {
			return nil, nil, protoErr("invalid header field")
		}
		k = textproto.CanonicalMIMEHeaderKey(k)
		if vv, ok := hdr[k]; ok {
			hdr[k] = append(vv, v)
		} else {
			vals[i] = v
			hdr[k] = vals[i : i+1 : i+1]
		}
	}
	return hdr, p[end:], nil
}

// headerName returns the names the edge and the host send on every stream
// as constants, so a header map keyed by them does not keep the block's
// text alive through its keys alone and CanonicalMIMEHeaderKey finds them
// canonical at once.
func headerName(b []byte) (string, bool) {
	switch string(b) { // no allocation: the compiler compares in place
	case "Content-Type":
		return "Content-Type", true
	case "X-Shoal-Database":
		return "X-Shoal-Database", true
	case "X-Shoal-Account":
		return "X-Shoal-Account", true
	case "X-Shoal-Generation":
		return "X-Shoal-Generation", true
	case "X-Request-Id":
		return "X-Request-Id", true
	case "X-Shoal-Read-Only":
		return "X-Shoal-Read-Only", true
	case "Shoal-Numbers":
		return "Shoal-Numbers", true
	case "Authorization":
		return "Authorization", true
	case "Retry-After":
		return "Retry-After", true
	}
	return "", false
}

func string16(p []byte) (string, []byte, error) {
	if len(p) < 2 {
		return "", nil, protoErr("short string")
	}
	n := int(binary.BigEndian.Uint16(p))
	if len(p) < 2+n {
		return "", nil, protoErr("string past the frame")
	}
	return string(p[2 : 2+n]), p[2+n:], nil
}

// validName reports an HTTP token (RFC 9110 tchar).
func validName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}

func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// AppendRequest appends the frames of a request — a Request frame and as
// many Data frames as body needs — on stream.
func AppendRequest(b []byte, stream uint32, path string, hdr http.Header, body []byte) ([]byte, error) {
	if len(path) > 0xffff || !validValue(path) || path == "" || path[0] != '/' {
		return b, fmt.Errorf("frame: invalid path %q", path)
	}
	if int64(len(body)) > 0xffffffff {
		return b, errors.New("frame: body over 4 GiB")
	}
	start := len(b)
	b = AppendHeader(b, Header{Type: TypeRequest, Stream: stream})
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = appendString16(b, path)
	b, err := AppendHeaderBlock(b, hdr)
	if err != nil {
		return b[:start], err
	}
	if len(b)-start-HeaderLen > MaxPayload {
		return b[:start], errors.New("frame: request head over one frame")
	}
	return appendBody(b, start, body), nil
}

// appendBody completes the frame begun at start (its header's length and
// flags still to fill) with as much of body as fits, then appends Data
// frames for the rest; FlagEnd goes on the last.
func appendBody(b []byte, start int, body []byte) []byte {
	room := MaxPayload - (len(b) - start - HeaderLen)
	first := min(room, len(body))
	b = append(b, body[:first]...)
	body = body[first:]
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderLen))
	if len(body) == 0 {
		b[start+5] = FlagEnd
		return b
	}
	for len(body) > 0 {
		n := min(MaxPayload, len(body))
		var fl uint8
		if n == len(body) {
			fl = FlagEnd
		}
		stream := binary.BigEndian.Uint32(b[start+8:])
		b = AppendHeader(b, Header{Len: uint32(n), Type: TypeData, Flags: fl, Stream: stream})
		b = append(b, body[:n]...)
		body = body[n:]
	}
	return b
}

// Request is a parsed Request frame.
type Request struct {
	BodyLen int // the whole body's length, as the client declared it
	Path    string
	Header  http.Header
	Chunk   []byte // the body's first bytes (aliases the payload)
}

// ParseRequest parses a Request frame's payload.
func ParseRequest(p []byte) (Request, error) {
	if len(p) < 4 {
		return Request{}, protoErr("short request")
	}
	r := Request{BodyLen: int(binary.BigEndian.Uint32(p))}
	var err error
	if r.Path, p, err = string16(p[4:]); err != nil {
		return r, err
	}
	if r.Path == "" || r.Path[0] != '/' || !validValue(r.Path) {
		return r, protoErr("invalid path")
	}
	if r.Header, p, err = parseHeaderBlock(p); err != nil {
		return r, err
	}
	if len(p) > r.BodyLen {
		return r, protoErr("body past its declared length")
	}
	r.Chunk = p
	return r, nil
}

// AppendResponse appends an answer's frames — a Response frame with status,
// hdr and up to chunk bytes of body, then Data frames if more of body fits
// no frame — and returns how much of body went in. end marks the answer
// complete once all of body is in (FlagEnd on the last frame). The caller
// limits body to the stream's window.
func AppendResponse(b []byte, stream uint32, status int, hdr http.Header, body []byte, end bool) ([]byte, error) {
	start := len(b)
	b = AppendHeader(b, Header{Type: TypeResponse, Stream: stream})
	b = binary.BigEndian.AppendUint16(b, uint16(status))
	b, err := AppendHeaderBlock(b, hdr)
	if err != nil {
		return b[:start], err
	}
	if len(b)-start-HeaderLen > MaxPayload {
		return b[:start], errors.New("frame: response head over one frame")
	}
	b = appendBody(b, start, body)
	if !end {
		clearLastEnd(b, start)
	}
	return b, nil
}

// AppendData appends body as Data frames on stream (at least one frame,
// even for an empty body with end).
func AppendData(b []byte, stream uint32, body []byte, end bool) []byte {
	start := len(b)
	b = AppendHeader(b, Header{Type: TypeData, Stream: stream})
	b = appendBody(b, start, body)
	if !end {
		clearLastEnd(b, start)
	}
	return b
}

// clearLastEnd removes FlagEnd from the last frame of those appended from
// start (appendBody sets it on the last one).
func clearLastEnd(b []byte, start int) {
	for i := start; i < len(b); {
		n := int(binary.BigEndian.Uint32(b[i:]))
		if i+HeaderLen+n == len(b) {
			b[i+5] &^= FlagEnd
			return
		}
		i += HeaderLen + n
	}
}

// Response is a parsed Response frame.
type Response struct {
	Status int
	Header http.Header
	Chunk  []byte // the body's first bytes (aliases the payload)
}

// ParseResponse parses a Response frame's payload.
func ParseResponse(p []byte) (Response, error) {
	if len(p) < 2 {
		return Response{}, protoErr("short response")
	}
	r := Response{Status: int(binary.BigEndian.Uint16(p))}
	if r.Status < 100 || r.Status > 999 {
		return r, protoErr("status %d", r.Status)
	}
	var err error
	if r.Header, r.Chunk, err = parseHeaderBlock(p[2:]); err != nil {
		return r, err
	}
	return r, nil
}

// AppendReset appends a Reset frame.
func AppendReset(b []byte, stream uint32) []byte {
	return AppendHeader(b, Header{Type: TypeReset, Stream: stream})
}

// AppendWindow appends a Window frame granting n more bytes.
func AppendWindow(b []byte, stream uint32, n uint32) []byte {
	b = AppendHeader(b, Header{Len: 4, Type: TypeWindow, Stream: stream})
	return binary.BigEndian.AppendUint32(b, n)
}

// AppendGoAway appends a GoAway frame naming the last stream answered.
func AppendGoAway(b []byte, last uint32) []byte {
	b = AppendHeader(b, Header{Len: 4, Type: TypeGoAway})
	return binary.BigEndian.AppendUint32(b, last)
}

// Uint32 is the payload of a Window or GoAway frame.
func Uint32(p []byte) uint32 { return binary.BigEndian.Uint32(p) }
