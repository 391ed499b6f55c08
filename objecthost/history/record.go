package history

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"

	"github.com/klauspost/compress/s2"
)

// A record is one committed transaction, the unit of the change log:
//
//	header (64 bytes, big-endian)
//	   0 magic "SHTX"          4 version (1 or 2)  8 page size
//	  12 page count n         16 database size in pages after the commit
//	  20 CRC of the previous record (0 for the first of a generation)
//	  24 txid (1, 2, … per generation)             32 commit time (µs, Unix)
//	  40 WAL position after the commit: salt1, salt2, frames, ck0, ck1
//	  60 version 1: reserved (0); versions 2, 3: length of the body
//	body: n × (page number u32, page bytes), ascending page numbers;
//	      version 2 stores it S2-compressed (a block, klauspost/compress/s2);
//	      version 3 has a kind byte after each page number (full page, or
//	      a patch against the page as of the previous record: see below),
//	      S2-compressed
//	trailer: CRC-32C of everything before it (the stored bytes)
//
// Version 3 is what capture writes: a one-row commit changes a few dozen
// bytes of one page, so the body is a fraction of a page
// (BenchmarkWriteAmplification), which every later step pays for (the
// staging write(2), its writeback, the fsync before a WAL restart,
// shipping, the store) and, with patches, S2 compresses only those bytes.
// Version 1 and 2 records (archives written before) are still read.
//
// Records are self-delimiting and chained: a record carries the CRC of its
// predecessor, and txids are consecutive, so a missing, doubled or
// reordered record is detected on replay, and a torn tail (crash in the
// middle of an append) fails its CRC. The WAL position is local
// bookkeeping (where capture resumes after a restart); restore ignores it.

const (
	recordMagic      = "SHTX"
	recordVersionRaw = 1 // body stored as is
	recordVersionS2  = 2 // body S2-compressed
	recordVersion    = 3 // body S2-compressed, pages full or patched; what encodeRecord writes
	recordHeaderSize = 64
	recordTrailer    = 4
)

// Version 3 bodies (before S2) hold, per page in ascending page order:
//
//	page number u32, kind u8, then
//	  kind 0 (full):  the page (page size bytes)
//	  kind 1 (patch): range count u16, then per range offset u16, length
//	                  u16 and the bytes; the page is the database's page as
//	                  of the previous record (txid − 1) with these bytes
//	                  replaced
//
// A patch is written only against the version of the page that capture
// itself recorded last in this generation, and only while that page
// stayed inside the database (pageCache), so the page a restore holds
// when it replays record txid − 1 → txid (built from a snapshot of this
// generation and the records after it, in order) is that version. A
// one-row INSERT changes a few dozen bytes of a 4 KiB leaf: a patch skips
// compressing (and staging, shipping, storing) the unchanged rest, which
// was most of capture's CPU (S2 ≈ 1.5 µs of ≈ 2.5 µs per insert).
const (
	pageFull  = 0
	pagePatch = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is returned when a record, segment or snapshot fails its
// checksum, its chain or its format.
var ErrCorrupt = errors.New("history: corrupt archive data")

type recordHeader struct {
	PageSize uint32
	NPages   uint32
	DBSize   uint32
	PrevCRC  uint32
	Txid     uint64
	TimeUs   int64
	WAL      walPos
	CRC      uint32 // the record's own trailer, filled by encode/decode
	// version and BodyLen (version 2: the compressed body's length) are
	// filled by decodeHeader.
	version uint32
	BodyLen uint32 `json:"-"`
}

type page struct {
	no   uint32
	data []byte
	// patch: data is a version 3 patch (ranges) to apply to the page as
	// it was after the previous record (applyPage), not the page.
	patch bool
}

// applyPage writes pg into the database image f (page size ps): a full
// page as is, a patch onto the page f holds (zeros past its end).
func applyPage(f interface {
	io.ReaderAt
	io.WriterAt
}, ps int64, pg page, scratch *[]byte) error {
	off := int64(pg.no-1) * ps
	if !pg.patch {
		_, err := f.WriteAt(pg.data, off)
		return err
	}
	if int64(cap(*scratch)) < ps {
		*scratch = make([]byte, ps)
	}
	cur := (*scratch)[:ps]
	n, err := f.ReadAt(cur, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	clear(cur[n:])
	if err := patchPage(cur, pg.data); err != nil {
		return err
	}
	_, err = f.WriteAt(cur, off)
	return err
}

// patchPage applies a version 3 patch to page (validated by decodeBody).
func patchPage(pg, patch []byte) error {
	be := binary.BigEndian
	if len(patch) < 2 {
		return fmt.Errorf("%w: short patch", ErrCorrupt)
	}
	n := int(be.Uint16(patch))
	p := patch[2:]
	for range n {
		if len(p) < 4 {
			return fmt.Errorf("%w: short patch", ErrCorrupt)
		}
		off, l := int(be.Uint16(p)), int(be.Uint16(p[2:]))
		if off+l > len(pg) || len(p) < 4+l {
			return fmt.Errorf("%w: patch range out of the page", ErrCorrupt)
		}
		copy(pg[off:off+l], p[4:4+l])
		p = p[4+l:]
	}
	return nil
}

// pageCacheSlots: how many pages' last captured versions a capturer keeps
// (per open database, page size bytes each): a table's growing leaf, its
// parent, page 1, one more.
const pageCacheSlots = 4

// pageCache holds the last version capture recorded of a few pages of the
// current generation, the base of the next record's patches. Capture
// goroutine only. Invariant: an entry is the database's page as of the
// last record captured; it is dropped when a record's database size no
// longer covers it (a restore from a snapshot taken then would read zeros
// there), and everything is dropped when that cannot be vouched for (a new
// generation, a failed append whose records are captured again, a page
// size change).
type pageCache struct {
	slots [pageCacheSlots]struct {
		no   uint32
		used uint64
		data []byte // nil: empty slot
	}
	tick uint64
}

func (pc *pageCache) get(no uint32) []byte {
	for i := range pc.slots {
		if s := &pc.slots[i]; s.data != nil && s.no == no {
			pc.tick++
			s.used = pc.tick
			return s.data
		}
	}
	return nil
}

// put records data as page no's latest version (copied).
func (pc *pageCache) put(no uint32, data []byte) {
	victim := 0
	for i := range pc.slots {
		s := &pc.slots[i]
		if s.data != nil && s.no == no {
			victim = i
			break
		}
		if s.data == nil || pc.slots[victim].data != nil && s.used < pc.slots[victim].used {
			victim = i
		}
	}
	s := &pc.slots[victim]
	if cap(s.data) != len(data) {
		s.data = make([]byte, len(data))
	}
	s.data = s.data[:len(data)]
	copy(s.data, data)
	s.no = no
	pc.tick++
	s.used = pc.tick
}

// dropAbove forgets the pages past a database of size pages.
func (pc *pageCache) dropAbove(size uint32) {
	for i := range pc.slots {
		if pc.slots[i].data != nil && pc.slots[i].no > size {
			pc.slots[i].data = nil
		}
	}
}

func (pc *pageCache) reset() {
	for i := range pc.slots {
		pc.slots[i].data = nil
	}
}

// appendPatch appends the version 3 patch turning old into cur to dst, or
// returns ok=false when it would not be much smaller than the page (more
// than a quarter of it changed, or too many ranges). Ranges are found per
// 64-byte block (bytes.Equal skips equal blocks at memcmp speed), refined
// to 8-byte words, and merged when less than 16 bytes apart.
func appendPatch(dst, old, cur []byte) ([]byte, bool) {
	be := binary.BigEndian
	start := len(dst)
	dst = append(dst, 0, 0)
	limit := len(cur) / 4
	nr, size := 0, 0
	rs, re := -1, -1 // the open range [rs, re)
	emit := func() bool {
		if rs < 0 {
			return true
		}
		l := re - rs
		size += 4 + l
		nr++
		if size > limit || nr > 0xffff || l > 0xffff {
			return false
		}
		dst = be.AppendUint16(dst, uint16(rs))
		dst = be.AppendUint16(dst, uint16(l))
		dst = append(dst, cur[rs:re]...)
		return true
	}
	const block, word, gap = 64, 8, 16
	for b := 0; b < len(cur); b += block {
		e := min(b+block, len(cur))
		if bytes.Equal(old[b:e], cur[b:e]) {
			continue
		}
		for w := b; w < e; w += word {
			we := min(w+word, e)
			if bytes.Equal(old[w:we], cur[w:we]) {
				continue
			}
			if rs >= 0 && w-re < gap {
				re = we
				continue
			}
			if !emit() {
				return dst[:start], false
			}
			rs, re = w, we
		}
	}
	if !emit() {
		return dst[:start], false
	}
	be.PutUint16(dst[start:], uint16(nr))
	return dst, true
}

// rawPool holds the uncompressed bodies encodeRecord builds before
// compressing them (capture encodes on one goroutine per database).
var rawPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// encodeRecord appends the record of tx to dst (version 3, every page
// full) and returns it with the header (CRC filled in).
func encodeRecord(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	return encodeRecordWith(dst, h, pages, nil)
}

// encodeRecordWith is encodeRecord with the pages pc holds written as
// patches against their cached version (when that is much smaller), and
// pc updated to this record's pages (nil: all full, no cache). The caller
// then drops the cached pages past h.DBSize (pageCache).
func encodeRecordWith(dst []byte, h recordHeader, pages map[uint32][]byte, pc *pageCache) ([]byte, recordHeader) {
	var small [16]uint32
	nos := sortedPageNos(small[:0], pages)
	h.NPages = uint32(len(nos))
	be := binary.BigEndian
	rawp := rawPool.Get().(*[]byte)
	raw := (*rawp)[:0]
	for _, no := range nos {
		pg := pages[no]
		raw = be.AppendUint32(raw, no)
		patched := false
		if pc != nil {
			if old := pc.get(no); old != nil && len(old) == len(pg) {
				mark := len(raw)
				raw = append(raw, pagePatch)
				if raw, patched = appendPatch(raw, old, pg); !patched {
					raw = raw[:mark]
				}
			}
			pc.put(no, pg)
		}
		if !patched {
			raw = append(raw, pageFull)
			raw = append(raw, pg...)
		}
	}
	start := len(dst)
	maxLen := s2.MaxEncodedLen(len(raw))
	dst = slices.Grow(dst, recordHeaderSize+maxLen+recordTrailer)
	body := s2.Encode(dst[start+recordHeaderSize:start+recordHeaderSize+maxLen], raw)
	*rawp = raw
	rawPool.Put(rawp)
	hb := dst[start : start+recordHeaderSize]
	putRecordHeader(hb, recordVersion, h)
	be.PutUint32(hb[60:], uint32(len(body)))
	dst = dst[:start+recordHeaderSize+len(body)]
	h.CRC = crc32.Checksum(dst[start:], castagnoli)
	dst = be.AppendUint32(dst, h.CRC)
	return dst, h
}

// encodeRecordV2 appends a version 2 record (every page full, body
// S2-compressed): archives written between version 1 and 3 hold these;
// tests check that they still read.
func encodeRecordV2(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	var small [16]uint32
	nos := sortedPageNos(small[:0], pages)
	h.NPages = uint32(len(nos))
	be := binary.BigEndian
	var raw []byte
	for _, no := range nos {
		raw = be.AppendUint32(raw, no)
		raw = append(raw, pages[no]...)
	}
	start := len(dst)
	body := s2.Encode(nil, raw)
	var hb [recordHeaderSize]byte
	putRecordHeader(hb[:], recordVersionS2, h)
	be.PutUint32(hb[60:], uint32(len(body)))
	dst = append(dst, hb[:]...)
	dst = append(dst, body...)
	h.CRC = crc32.Checksum(dst[start:], castagnoli)
	dst = be.AppendUint32(dst, h.CRC)
	return dst, h
}

// encodeRecordRaw appends a version 1 record (body uncompressed): archives
// written before version 2 hold these; tests check that they still read.
func encodeRecordRaw(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	var small [16]uint32
	nos := sortedPageNos(small[:0], pages)
	h.NPages = uint32(len(nos))
	start := len(dst)
	var hb [recordHeaderSize]byte
	putRecordHeader(hb[:], recordVersionRaw, h)
	be := binary.BigEndian
	dst = append(dst, hb[:]...)
	for _, no := range nos {
		dst = be.AppendUint32(dst, no)
		dst = append(dst, pages[no]...)
	}
	h.CRC = crc32.Checksum(dst[start:], castagnoli)
	dst = be.AppendUint32(dst, h.CRC)
	return dst, h
}

// recordSize is the stored size of a record with header h.
func recordSize(h recordHeader) int64 {
	if h.version == recordVersionRaw {
		return recordHeaderSize + int64(h.NPages)*int64(4+h.PageSize) + recordTrailer
	}
	return recordHeaderSize + int64(h.BodyLen) + recordTrailer
}

func decodeHeader(b []byte) (recordHeader, error) {
	var h recordHeader
	if len(b) < recordHeaderSize || string(b[:4]) != recordMagic {
		return h, fmt.Errorf("%w: bad record magic", ErrCorrupt)
	}
	be := binary.BigEndian
	h.version = be.Uint32(b[4:])
	if h.version != recordVersionRaw && h.version != recordVersionS2 && h.version != recordVersion {
		return h, fmt.Errorf("%w: record version %d", ErrCorrupt, h.version)
	}
	h.PageSize = be.Uint32(b[8:])
	h.NPages = be.Uint32(b[12:])
	h.DBSize = be.Uint32(b[16:])
	h.PrevCRC = be.Uint32(b[20:])
	h.Txid = be.Uint64(b[24:])
	h.TimeUs = int64(be.Uint64(b[32:]))
	h.WAL = walPos{be.Uint32(b[40:]), be.Uint32(b[44:]), be.Uint32(b[48:]), be.Uint32(b[52:]), be.Uint32(b[56:])}
	if h.version != recordVersionRaw {
		h.BodyLen = be.Uint32(b[60:])
	}
	if h.PageSize < 512 || h.PageSize > 65536 || h.PageSize&(h.PageSize-1) != 0 {
		return h, fmt.Errorf("%w: page size %d", ErrCorrupt, h.PageSize)
	}
	return h, nil
}

// readRecords decodes the records of a segment (or of a local staging
// file) in order, verifying each CRC. A torn or corrupt record stops the
// scan: with tolerateTail (local files after a crash) the records before it
// are returned with the offset where the valid prefix ends; without it
// (archived segments, which are immutable and complete) it is an error.
func readRecords(r io.Reader, tolerateTail bool, fn func(h recordHeader, pages []page) error) (validBytes int64, err error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var hb [recordHeaderSize]byte
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return validBytes, nil
			}
			if tolerateTail && errors.Is(err, io.ErrUnexpectedEOF) {
				return validBytes, nil
			}
			return validBytes, fmt.Errorf("%w: truncated record header", ErrCorrupt)
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			if tolerateTail {
				return validBytes, nil
			}
			return validBytes, err
		}
		size := recordSize(h)
		rawLen := int64(h.NPages) * int64(4+h.PageSize)
		if h.version == recordVersion {
			rawLen += int64(h.NPages) // the kind byte; patches are shorter than pages
		}
		if h.NPages > 1<<22 || int64(h.BodyLen) > int64(s2.MaxEncodedLen(int(min(rawLen, 1<<40)))) {
			if tolerateTail {
				return validBytes, nil
			}
			return validBytes, fmt.Errorf("%w: record of %d pages", ErrCorrupt, h.NPages)
		}
		body := make([]byte, size-recordHeaderSize)
		if _, err := io.ReadFull(br, body); err != nil {
			if tolerateTail {
				return validBytes, nil
			}
			return validBytes, fmt.Errorf("%w: truncated record", ErrCorrupt)
		}
		crc := crc32.Update(crc32.Checksum(hb[:], castagnoli), castagnoli, body[:len(body)-recordTrailer])
		if crc != binary.BigEndian.Uint32(body[len(body)-recordTrailer:]) {
			if tolerateTail {
				return validBytes, nil
			}
			return validBytes, fmt.Errorf("%w: record %d checksum", ErrCorrupt, h.Txid)
		}
		h.CRC = crc
		raw := body[:len(body)-recordTrailer]
		switch h.version {
		case recordVersionS2:
			// The CRC held, so a failure here is a bug or a forged record,
			// never a torn tail: an error even with tolerateTail.
			if n, err := s2.DecodedLen(raw); err != nil || int64(n) != rawLen {
				return validBytes, fmt.Errorf("%w: record %d: compressed body of %d bytes, want %d (%v)", ErrCorrupt, h.Txid, n, rawLen, err)
			}
			if raw, err = s2.Decode(make([]byte, rawLen), raw); err != nil {
				return validBytes, fmt.Errorf("%w: record %d: %v", ErrCorrupt, h.Txid, err)
			}
		case recordVersion:
			n, err := s2.DecodedLen(raw)
			if err != nil || int64(n) > rawLen {
				return validBytes, fmt.Errorf("%w: record %d: compressed body of %d bytes, at most %d (%v)", ErrCorrupt, h.Txid, n, rawLen, err)
			}
			if raw, err = s2.Decode(make([]byte, n), raw); err != nil {
				return validBytes, fmt.Errorf("%w: record %d: %v", ErrCorrupt, h.Txid, err)
			}
		}
		var pages []page
		if h.version == recordVersion {
			if pages, err = decodeBodyV3(raw, h); err != nil {
				return validBytes, err
			}
		} else {
			pages = make([]page, h.NPages)
			stride := 4 + int(h.PageSize)
			for i := range pages {
				b := raw[i*stride : (i+1)*stride]
				pages[i] = page{no: binary.BigEndian.Uint32(b), data: b[4:]}
			}
		}
		if err := fn(h, pages); err != nil {
			return validBytes, err
		}
		validBytes += size
	}
}

// decodeBodyV3 splits a version 3 body into its pages, checking every
// length and range (the CRC held: a failure is a bug or a forged record).
func decodeBodyV3(raw []byte, h recordHeader) ([]page, error) {
	be := binary.BigEndian
	ps := int(h.PageSize)
	pages := make([]page, h.NPages)
	bad := func(what string) error {
		return fmt.Errorf("%w: record %d: %s", ErrCorrupt, h.Txid, what)
	}
	for i := range pages {
		if len(raw) < 5 {
			return nil, bad("truncated page entry")
		}
		pages[i].no = be.Uint32(raw)
		kind := raw[4]
		raw = raw[5:]
		switch kind {
		case pageFull:
			if len(raw) < ps {
				return nil, bad("truncated page")
			}
			pages[i].data, raw = raw[:ps:ps], raw[ps:]
		case pagePatch:
			if len(raw) < 2 {
				return nil, bad("truncated patch")
			}
			n := int(be.Uint16(raw))
			p := 2
			for range n {
				if len(raw) < p+4 {
					return nil, bad("truncated patch")
				}
				off, l := int(be.Uint16(raw[p:])), int(be.Uint16(raw[p+2:]))
				if off+l > ps || len(raw) < p+4+l {
					return nil, bad("patch range out of the page")
				}
				p += 4 + l
			}
			pages[i].data, pages[i].patch, raw = raw[:p:p], true, raw[p:]
		default:
			return nil, bad(fmt.Sprintf("page kind %d", kind))
		}
		if pages[i].no == 0 || i > 0 && pages[i].no <= pages[i-1].no {
			return nil, bad("page numbers not ascending")
		}
	}
	if len(raw) != 0 {
		return nil, bad("trailing bytes in the body")
	}
	return pages, nil
}

// putRecordHeader writes h's fields (all but the version 2 body length at
// hb[60:] and the CRC, which follow the body) into hb, a record header.
func putRecordHeader(hb []byte, version uint32, h recordHeader) {
	be := binary.BigEndian
	copy(hb[0:], recordMagic)
	be.PutUint32(hb[4:], version)
	be.PutUint32(hb[8:], h.PageSize)
	be.PutUint32(hb[12:], h.NPages)
	be.PutUint32(hb[16:], h.DBSize)
	be.PutUint32(hb[20:], h.PrevCRC)
	be.PutUint64(hb[24:], h.Txid)
	be.PutUint64(hb[32:], uint64(h.TimeUs))
	be.PutUint32(hb[40:], h.WAL.Salt1)
	be.PutUint32(hb[44:], h.WAL.Salt2)
	be.PutUint32(hb[48:], h.WAL.Frames)
	be.PutUint32(hb[52:], h.WAL.Ck0)
	be.PutUint32(hb[56:], h.WAL.Ck1)
}

// sortedPageNos appends the page numbers of pages to dst in increasing
// order (the order every record version stores its pages in).
func sortedPageNos(dst []uint32, pages map[uint32][]byte) []uint32 {
	for no := range pages {
		dst = append(dst, no)
	}
	slices.Sort(dst)
	return dst
}
