package frame

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readAll parses every frame in b.
func readAll(t testing.TB, b []byte) ([]Header, [][]byte) {
	r := NewReader(bufio.NewReader(bytes.NewReader(b)))
	var hs []Header
	var ps [][]byte
	for {
		h, p, err := r.Next()
		if err == io.EOF {
			return hs, ps
		}
		require.NoError(t, err)
		hs = append(hs, h)
		ps = append(ps, bytes.Clone(p))
	}
}

func TestRequestRoundTrip(t *testing.T) {
	hdr := http.Header{"X-Shoal-Database": {"db"}, "X-Shoal-Account": {"acct"}, "Content-Type": {"application/json"}}
	for _, n := range []int{0, 10, MaxPayload - 200, MaxPayload, 3*MaxPayload + 17} {
		body := bytes.Repeat([]byte("x"), n)
		b, err := AppendRequest(nil, 7, "/v1/objects/o/query", hdr, body)
		require.NoError(t, err)
		hs, ps := readAll(t, b)
		require.NotEmpty(t, hs)
		assert.Equal(t, TypeRequest, hs[0].Type)
		req, err := ParseRequest(ps[0])
		require.NoError(t, err)
		assert.Equal(t, "/v1/objects/o/query", req.Path)
		assert.Equal(t, hdr, req.Header)
		assert.Equal(t, n, req.BodyLen)
		got := append([]byte(nil), req.Chunk...)
		for i, h := range hs {
			assert.Equal(t, uint32(7), h.Stream)
			assert.Equal(t, i == len(hs)-1, h.End(), "FlagEnd on the last frame only (%d bytes, frame %d)", n, i)
			if i > 0 {
				assert.Equal(t, TypeData, h.Type)
				got = append(got, ps[i]...)
			}
		}
		assert.Equal(t, string(body), string(got))
	}
}

func TestResponseRoundTrip(t *testing.T) {
	hdr := http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}}
	body := bytes.Repeat([]byte("r"), MaxPayload+5)
	for _, end := range []bool{true, false} {
		b, err := AppendResponse(nil, 3, 429, hdr, body, end)
		require.NoError(t, err)
		hs, ps := readAll(t, b)
		require.Len(t, hs, 2)
		resp, err := ParseResponse(ps[0])
		require.NoError(t, err)
		assert.Equal(t, 429, resp.Status)
		assert.Equal(t, hdr, resp.Header)
		assert.Equal(t, body, append(append([]byte(nil), resp.Chunk...), ps[1]...))
		assert.False(t, hs[0].End())
		assert.Equal(t, end, hs[1].End())
	}
	b := AppendData(nil, 3, nil, true)
	hs, _ := readAll(t, b)
	require.Len(t, hs, 1)
	assert.True(t, hs[0].End())
	assert.Zero(t, hs[0].Len)
}

func TestParseHeaderRefuses(t *testing.T) {
	ok := AppendHeader(nil, Header{Len: 4, Type: TypeWindow, Stream: 1})
	_, err := ParseHeader(ok)
	require.NoError(t, err)
	for name, h := range map[string][]byte{
		"oversized":        AppendHeader(nil, Header{Len: MaxPayload + 1, Type: TypeData, Stream: 1}),
		"unknown type":     AppendHeader(nil, Header{Type: 9, Stream: 1}),
		"type zero":        AppendHeader(nil, Header{Type: 0, Stream: 1}),
		"unknown flag":     AppendHeader(nil, Header{Type: TypeData, Flags: 2, Stream: 1}),
		"stream 0":         AppendHeader(nil, Header{Type: TypeData}),
		"goaway on stream": AppendHeader(nil, Header{Len: 4, Type: TypeGoAway, Stream: 1}),
		"reset with bytes": AppendHeader(nil, Header{Len: 1, Type: TypeReset, Stream: 1}),
		"short window":     AppendHeader(nil, Header{Len: 3, Type: TypeWindow, Stream: 1}),
		"reserved":         append(AppendHeader(nil, Header{Type: TypeData, Stream: 1})[:6], 1, 0, 0, 0, 0, 1),
	} {
		_, err := ParseHeader(h)
		assert.ErrorIs(t, err, ErrProtocol, name)
	}
}

func TestReaderRefusesOversizedFrame(t *testing.T) {
	b := AppendHeader(nil, Header{Len: MaxPayload + 1, Type: TypeData, Stream: 1})
	b = append(b, make([]byte, MaxPayload+1)...)
	_, _, err := NewReader(bufio.NewReader(bytes.NewReader(b))).Next()
	assert.ErrorIs(t, err, ErrProtocol)
	// A frame cut short is an unexpected EOF, not a clean end.
	b = AppendHeader(nil, Header{Len: 10, Type: TypeData, Stream: 1})
	_, _, err = NewReader(bufio.NewReader(bytes.NewReader(append(b, 1, 2)))).Next()
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, _, err = NewReader(bufio.NewReader(bytes.NewReader(b[:5]))).Next()
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestEncodersRefuseWhatCannotBeCarried(t *testing.T) {
	for name, hdr := range map[string]http.Header{
		"CR in value":    {"X-A": {"a\r\nX-B: b"}},
		"colon in name":  {"X:A": {"a"}},
		"empty name":     {"": {"a"}},
		"too many":       manyHeaders(maxHeaders + 1),
		"NUL in value":   {"X-A": {"a\x00"}},
		"space in name":  {"X A": {"a"}},
		"newline name":   {"X\nA": {"a"}},
		"value over 64K": {"X-A": {strings.Repeat("v", 70000)}},
	} {
		b, err := AppendRequest([]byte("keep"), 1, "/p", hdr, nil)
		assert.Error(t, err, name)
		assert.Equal(t, "keep", string(b), "%s: nothing appended", name)
	}
	_, err := AppendRequest(nil, 1, "no-slash", nil, nil)
	assert.Error(t, err)
	_, err = AppendRequest(nil, 1, "/a\nb", nil, nil)
	assert.Error(t, err)
}

func manyHeaders(n int) http.Header {
	h := http.Header{}
	for i := 0; i < n; i++ {
		h.Add("X-A", "v")
	}
	return h
}

func TestParseRefusesMalformedPayloads(t *testing.T) {
	good, err := AppendRequest(nil, 1, "/p", http.Header{"X-A": {"v"}}, []byte("body"))
	require.NoError(t, err)
	p := good[HeaderLen:]
	// Every truncation of the head is refused (a shorter body is a
	// shorter chunk, which is fine).
	headLen := len(p) - len("body")
	for i := 0; i < headLen; i++ {
		_, err := ParseRequest(p[:i])
		assert.ErrorIs(t, err, ErrProtocol, "truncated at %d", i)
	}
	// A chunk longer than the declared body.
	bad := bytes.Clone(p)
	bad[3] = 2 // declared 2 bytes, 4 present
	_, err = ParseRequest(bad)
	assert.ErrorIs(t, err, ErrProtocol)
	_, err = ParseResponse([]byte{0, 99, 0, 0})
	assert.ErrorIs(t, err, ErrProtocol, "status 99")
}

// FuzzReader feeds arbitrary bytes to the frame reader and the payload
// parsers, as a peer could: they must return errors, never panic, and
// whatever they accept must re-encode to a frame that parses the same.
func FuzzReader(f *testing.F) {
	req, _ := AppendRequest(nil, 1, "/v1/objects/o/query", http.Header{"X-Shoal-Database": {"d"}}, []byte(`{"sql":"SELECT 1"}`))
	resp, _ := AppendResponse(nil, 1, 200, http.Header{"Content-Type": {"application/json"}}, []byte(`{"result":[]}`), true)
	f.Add(req)
	f.Add(resp)
	f.Add(AppendGoAway(AppendWindow(AppendReset(nil, 1), 1, 10), 5))
	f.Add(AppendData(nil, 2, bytes.Repeat([]byte("d"), 100), false))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(bufio.NewReader(bytes.NewReader(b)))
		for i := 0; i < 64; i++ {
			h, p, err := r.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if int(h.Len) != len(p) || h.Len > MaxPayload {
				t.Fatalf("payload %d bytes, header says %d", len(p), h.Len)
			}
			switch h.Type {
			case TypeRequest:
				rq, err := ParseRequest(p)
				if err != nil {
					continue
				}
				if len(rq.Chunk) > rq.BodyLen {
					t.Fatalf("chunk past the declared body")
				}
				enc, err := AppendRequest(nil, h.Stream, rq.Path, rq.Header, rq.Chunk)
				if err != nil {
					continue // e.g. a non-canonical duplicate the block held
				}
				_, ps := readAll(t, enc)
				again, err := ParseRequest(ps[0])
				if err != nil || again.Path != rq.Path || len(again.Header) != len(rq.Header) {
					t.Fatalf("re-encoded request differs: %v", err)
				}
			case TypeResponse:
				rs, err := ParseResponse(p)
				if err == nil && (rs.Status < 100 || rs.Status > 999) {
					t.Fatalf("status %d accepted", rs.Status)
				}
			case TypeWindow, TypeGoAway:
				_ = Uint32(p)
			}
		}
	})
}

// TestWriterConcurrentFramesStayWhole: many goroutines sending at once
// produce a stream of whole frames, each goroutine's in order.
func TestWriterConcurrentFramesStayWhole(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	w := NewWriter(a, func(error) {})
	const senders, each = 16, 200
	got := make(chan map[uint32]int, 1)
	go func() {
		r := NewReader(bufio.NewReader(b))
		last := map[uint32]int{}
		for n := 0; n < senders*each; n++ {
			h, p, err := r.Next()
			if err != nil {
				t.Error(err)
				break
			}
			seq := int(p[0])<<8 | int(p[1])
			if seq != last[h.Stream] {
				t.Errorf("stream %d: frame %d after %d", h.Stream, seq, last[h.Stream]-1)
			}
			last[h.Stream] = seq + 1
		}
		got <- last
	}()
	var wg sync.WaitGroup
	for s := 1; s <= senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				_, queued, err := w.Send(func(buf []byte) []byte {
					return AppendData(buf, uint32(s), append([]byte{byte(i >> 8), byte(i)}, make([]byte, i%50)...), false)
				})
				if !queued || err != nil {
					t.Error(queued, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	last := <-got
	for s := 1; s <= senders; s++ {
		assert.Equal(t, each, last[uint32(s)])
	}
}

type failingConn struct {
	n    int // writes that succeed
	seen int
}

func (f *failingConn) Write(p []byte) (int, error) {
	if f.seen >= f.n {
		return 0, errors.New("broken")
	}
	f.seen++
	return len(p), nil
}

func TestWriterFailure(t *testing.T) {
	failed := 0
	w := NewWriter(&failingConn{n: 1}, func(error) { failed++ })
	start, queued, err := w.Send(func(b []byte) []byte { return AppendReset(b, 1) })
	require.NoError(t, err)
	assert.True(t, queued)
	assert.Zero(t, start)
	start, queued, err = w.Send(func(b []byte) []byte { return AppendReset(b, 2) })
	assert.Error(t, err, "the write carrying it failed")
	assert.True(t, queued)
	assert.Equal(t, uint64(HeaderLen), start)
	assert.Equal(t, 1, failed)
	assert.Equal(t, uint64(2*HeaderLen), w.Handed())
	_, queued, err = w.Send(func(b []byte) []byte { return AppendReset(b, 3) })
	assert.Error(t, err)
	assert.False(t, queued, "after the failure nothing is queued")
	assert.Equal(t, 1, failed)
}

func TestWriterCloseWhenFlushed(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, func(error) {})
	_, _, err := w.Send(func(b []byte) []byte { return AppendReset(b, 1) })
	require.NoError(t, err)
	closed := 0
	w.CloseWhenFlushed(func() { closed++ })
	assert.Equal(t, 1, closed)
	_, queued, err := w.Send(func(b []byte) []byte { return AppendReset(b, 2) })
	assert.ErrorIs(t, err, ErrClosing)
	assert.False(t, queued)
	assert.Equal(t, HeaderLen, buf.Len())
}

// TestHeaderBlockValues: a header block's fields come back exactly — the
// constant names, others, repeated names in order, names to canonicalise,
// empty values — and owe nothing to the payload they were parsed from
// (the Reader reuses its buffer for the next frame).
func TestHeaderBlockValues(t *testing.T) {
	hdr := http.Header{
		"X-Shoal-Database": {"db-uuid"},
		"X-Shoal-Account":  {"acct"},
		"Content-Type":     {"application/json"},
		"X-Custom":         {"a", "b", ""},
		"x-lower-case":     {"v"},
	}
	b, err := AppendRequest(nil, 1, "/p", hdr, []byte("body"))
	require.NoError(t, err)
	_, ps := readAll(t, b)
	req, err := ParseRequest(ps[0])
	require.NoError(t, err)
	for i := range ps[0] {
		ps[0][i] = 'Z' // the payload's bytes change under the parsed header
	}
	want := http.Header{
		"X-Shoal-Database": {"db-uuid"},
		"X-Shoal-Account":  {"acct"},
		"Content-Type":     {"application/json"},
		"X-Custom":         {"a", "b", ""},
		"X-Lower-Case":     {"v"},
	}
	assert.Equal(t, want, req.Header)
	assert.Equal(t, "/p", req.Path)
}
