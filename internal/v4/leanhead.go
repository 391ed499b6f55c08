package v4

import (
	"bytes"
	"net/http"
)

// leanHead is a request head the lean path serves.
type leanHead struct {
	n             int // bytes of the request line and headers, final CRLF included
	method, path  string
	rawQuery      string // after the '?', as url.ParseRequestURI keeps it ("": none)
	uri           string // the request target as sent (Request.RequestURI)
	host          string
	header        http.Header // as net/http builds it: canonical keys, no Host
	contentLength int64
}

// parseLeanHead parses b, a request line and header block ending with its
// empty line, and reports whether the request is plainly simple enough to
// be served lean — anything it is not sure of goes to net/http (false):
//
//   - the request line is "METHOD SP /path[?query] SP HTTP/1.1" with a
//     path of unreserved characters and '/' only (no escapes), an optional
//     non-empty query of unreserved characters, '%' and the sub-delims
//     url.ParseRequestURI keeps as they are (isQueryByte), and hot(method,
//     path) holds;
//   - every line ends with CRLF; every header is "Name: value" with a
//     token name and a value without control characters (HTAB aside), no
//     obs-fold, no name twice, at most leanMaxHeaders of them;
//   - exactly one Host, of host and port characters;
//   - no Transfer-Encoding, Expect or Upgrade; Connection, if present, is
//     "keep-alive";
//   - Content-Length, if present, is digits only and at most maxBody.
//
// What it returns is what net/http's parser returns for the same bytes.
func parseLeanHead(b []byte, maxBody int64, hot func(method, path string) bool) (leanHead, bool) {
	var h leanHead
	h.n = len(b)
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return h, false
	}
	line := b[:i-1]
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return h, false
	}
	method, rest := line[:sp], line[sp+1:]
	sp = bytes.IndexByte(rest, ' ')
	if sp <= 0 {
		return h, false
	}
	target, proto := rest[:sp], rest[sp+1:]
	if string(proto) != "HTTP/1.1" || target[0] != '/' {
		return h, false
	}
	for _, c := range method {
		if !isTokenByte(c) {
			return h, false
		}
	}
	path, query := target, []byte(nil)
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		path, query = target[:q], target[q+1:]
		if len(query) == 0 {
			return h, false // a bare '?' (url.URL.ForceQuery): net/http
		}
		for _, c := range query {
			if !isQueryByte(c) {
				return h, false
			}
		}
	}
	for _, c := range path {
		if !isPathByte(c) {
			return h, false
		}
	}
	switch string(method) {
	case http.MethodPost:
		h.method = http.MethodPost
	case http.MethodGet:
		h.method = http.MethodGet
	case http.MethodPut:
		h.method = http.MethodPut
	case http.MethodDelete:
		h.method = http.MethodDelete
	case http.MethodPatch:
		h.method = http.MethodPatch
	default:
		return h, false // HEAD, CONNECT, OPTIONS, …: net/http
	}
	h.path = string(path)
	if hot == nil || !hot(h.method, h.path) {
		return h, false
	}
	h.uri = h.path
	if query != nil {
		// url.ParseRequestURI keeps everything after the first '?' as
		// the raw query, unvalidated; a later Query() decodes it the
		// same way on either path.
		h.rawQuery = string(query)
		h.uri = string(target)
	}

	b = b[i+1:]
	lines := bytes.Count(b, []byte("\n")) - 1
	if lines > leanMaxHeaders {
		return h, false
	}
	h.header = make(http.Header, lines)
	strs := make([]string, lines) // one backing array, as textproto does
	haveHost, haveCL := false, false
	for {
		j := bytes.IndexByte(b, '\n')
		if j < 1 || b[j-1] != '\r' {
			return h, false
		}
		line, b = b[:j-1], b[j+1:]
		if len(line) == 0 {
			break
		}
		c := bytes.IndexByte(line, ':')
		if c <= 0 {
			return h, false // no name, or obs-fold (a line starting with SP/HT has no token name)
		}
		name, value := line[:c], trimOWSBytes(line[c+1:])
		for _, x := range name {
			if !isTokenByte(x) {
				return h, false
			}
		}
		for _, x := range value {
			if (x < ' ' && x != '\t') || x == 0x7f {
				return h, false
			}
		}
		key := canonicalKey(name)
		if _, dup := h.header[key]; dup || (key == "Host" && haveHost) {
			return h, false
		}
		switch key {
		case "Host":
			if len(value) == 0 {
				return h, false
			}
			for _, x := range value {
				if !isHostByte(x) {
					return h, false
				}
			}
			h.host, haveHost = string(value), true
			continue // net/http keeps it in Request.Host only
		case "Content-Length":
			if len(value) == 0 || len(value) > 18 {
				return h, false
			}
			var n int64
			for _, x := range value {
				if x < '0' || x > '9' {
					return h, false
				}
				n = n*10 + int64(x-'0')
			}
			if n > maxBody {
				return h, false
			}
			h.contentLength, haveCL = n, true
		case "Transfer-Encoding", "Expect", "Upgrade":
			return h, false
		case "Connection":
			if !asciiEqualFold(string(value), "keep-alive") {
				return h, false
			}
		}
		strs[0] = string(value)
		h.header[key] = strs[:1:1]
		strs = strs[1:]
	}
	if !haveHost {
		return h, false
	}
	if !haveCL {
		h.contentLength = 0
	}
	// net/http's fixPragmaCacheControl.
	if p := h.header["Pragma"]; len(p) > 0 && p[0] == "no-cache" {
		if _, ok := h.header["Cache-Control"]; !ok {
			h.header["Cache-Control"] = []string{"no-cache"}
		}
	}
	return h, true
}

// isTokenByte: RFC 9110 tchar.
func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// isPathByte: unreserved characters and '/', which url.ParseRequestURI
// keeps as they are (Path equal to the raw target, no RawPath).
func isPathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c == '-' || c == '.' || c == '_' || c == '~' || c == '/'
}

// isQueryByte: what a lean request's query may hold — unreserved
// characters, '%' (escapes are kept raw in RawQuery and decoded by the
// handler's Query(), as with net/http), '/', '?' and the sub-delims and
// ':' '@' of RFC 3986's query production. No '#', space or control byte.
func isQueryByte(c byte) bool {
	if isPathByte(c) {
		return true
	}
	switch c {
	case '%', '?', ':', '@', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=':
		return true
	}
	return false
}

// isHostByte: a host name, IPv4 or bracketed IPv6 address and port.
func isHostByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c == '-' || c == '.' || c == '_' || c == ':' || c == '[' || c == ']'
}

func trimOWSBytes(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// commonKeys interns the canonical names of headers clients send on the
// query routes (read-only).
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Length", "Content-Type", "Host", "Origin", "Pragma", "Referer", "User-Agent",
		"X-Request-Id", "X-Forwarded-For", "X-Forwarded-Proto", "Cf-Ray", "Sec-Fetch-Mode"} {
		m[k] = k
	}
	return m
}()

// canonicalKey is textproto.CanonicalMIMEHeaderKey for a name of token
// bytes.
func canonicalKey(name []byte) string {
	var buf [64]byte
	var k []byte
	if len(name) <= len(buf) {
		k = buf[:len(name)]
	} else {
		k = make([]byte, len(name))
	}
	upper := true
	for i, c := range name {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
	if s, ok := commonKeys[string(k)]; ok {
		return s
	}
	return string(k)
}
