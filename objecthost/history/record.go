package history

import (
	"bufio"
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
//	  60 version 1: reserved (0); version 2: length of the body
//	body: n × (page number u32, page bytes), ascending page numbers;
//	      version 2 stores it S2-compressed (a block, klauspost/compress/s2)
//	trailer: CRC-32C of everything before it (the stored bytes)
//
// Version 2 is what capture writes: a one-row commit changes one page that
// is mostly free space or repeated structure, so the body is a fraction of
// a page (BenchmarkWriteAmplification), which every later step pays for
// (the staging write(2), its writeback, the fsync before a WAL restart,
// shipping, the store). Version 1 records (archives written before) are
// still read.
//
// Records are self-delimiting and chained: a record carries the CRC of its
// predecessor, and txids are consecutive, so a missing, doubled or
// reordered record is detected on replay, and a torn tail (crash in the
// middle of an append) fails its CRC. The WAL position is local
// bookkeeping (where capture resumes after a restart); restore ignores it.

const (
	recordMagic      = "SHTX"
	recordVersionRaw = 1 // body stored as is
	recordVersion    = 2 // body S2-compressed; what encodeRecord writes
	recordHeaderSize = 64
	recordTrailer    = 4
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
}

// rawPool holds the uncompressed bodies encodeRecord builds before
// compressing them (capture encodes on one goroutine per database).
var rawPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// encodeRecord appends the record of tx to dst (version 2: the body
// S2-compressed) and returns it with the header (CRC filled in).
func encodeRecord(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	var small [16]uint32
	nos := small[:0]
	for no := range pages {
		nos = append(nos, no)
	}
	slices.Sort(nos)
	h.NPages = uint32(len(nos))
	be := binary.BigEndian
	rawp := rawPool.Get().(*[]byte)
	raw := (*rawp)[:0]
	for _, no := range nos {
		raw = be.AppendUint32(raw, no)
		raw = append(raw, pages[no]...)
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

// encodeRecordRaw appends a version 1 record (body uncompressed): archives
// written before version 2 hold these; tests check that they still read.
func encodeRecordRaw(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	var small [16]uint32
	nos := small[:0]
	for no := range pages {
		nos = append(nos, no)
	}
	slices.Sort(nos)
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
	if h.version != recordVersionRaw && h.version != recordVersion {
		return h, fmt.Errorf("%w: record version %d", ErrCorrupt, h.version)
	}
	h.PageSize = be.Uint32(b[8:])
	h.NPages = be.Uint32(b[12:])
	h.DBSize = be.Uint32(b[16:])
	h.PrevCRC = be.Uint32(b[20:])
	h.Txid = be.Uint64(b[24:])
	h.TimeUs = int64(be.Uint64(b[32:]))
	h.WAL = walPos{be.Uint32(b[40:]), be.Uint32(b[44:]), be.Uint32(b[48:]), be.Uint32(b[52:]), be.Uint32(b[56:])}
	if h.version == recordVersion {
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
		if h.version == recordVersion {
			// The CRC held, so a failure here is a bug or a forged record,
			// never a torn tail: an error even with tolerateTail.
			if n, err := s2.DecodedLen(raw); err != nil || int64(n) != rawLen {
				return validBytes, fmt.Errorf("%w: record %d: compressed body of %d bytes, want %d (%v)", ErrCorrupt, h.Txid, n, rawLen, err)
			}
			if raw, err = s2.Decode(make([]byte, rawLen), raw); err != nil {
				return validBytes, fmt.Errorf("%w: record %d: %v", ErrCorrupt, h.Txid, err)
			}
		}
		pages := make([]page, h.NPages)
		stride := 4 + int(h.PageSize)
		for i := range pages {
			b := raw[i*stride : (i+1)*stride]
			pages[i] = page{no: binary.BigEndian.Uint32(b), data: b[4:]}
		}
		if err := fn(h, pages); err != nil {
			return validBytes, err
		}
		validBytes += size
	}
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
