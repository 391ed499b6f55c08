package history

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// A record is one committed transaction, the unit of the change log:
//
//	header (64 bytes, big-endian)
//	   0 magic "SHTX"          4 version (1)       8 page size
//	  12 page count n         16 database size in pages after the commit
//	  20 CRC of the previous record (0 for the first of a generation)
//	  24 txid (1, 2, … per generation)             32 commit time (µs, Unix)
//	  40 WAL position after the commit: salt1, salt2, frames, ck0, ck1
//	  60 reserved
//	n × (page number u32, page bytes), ascending page numbers
//	trailer: CRC-32C of everything before it
//
// Records are self-delimiting and chained: a record carries the CRC of its
// predecessor, and txids are consecutive, so a missing, doubled or
// reordered record is detected on replay, and a torn tail (crash in the
// middle of an append) fails its CRC. The WAL position is local
// bookkeeping (where capture resumes after a restart); restore ignores it.

const (
	recordMagic      = "SHTX"
	recordVersion    = 1
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
}

type page struct {
	no   uint32
	data []byte
}

// encodeRecord appends the record of tx to dst and returns it with the
// header (CRC filled in).
func encodeRecord(dst []byte, h recordHeader, pages map[uint32][]byte) ([]byte, recordHeader) {
	var small [16]uint32
	nos := small[:0]
	for no := range pages {
		nos = append(nos, no)
	}
	slices.Sort(nos)
	h.NPages = uint32(len(nos))
	start := len(dst)
	var hb [recordHeaderSize]byte
	copy(hb[0:], recordMagic)
	be := binary.BigEndian
	be.PutUint32(hb[4:], recordVersion)
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
	dst = append(dst, hb[:]...)
	for _, no := range nos {
		dst = be.AppendUint32(dst, no)
		dst = append(dst, pages[no]...)
	}
	h.CRC = crc32.Checksum(dst[start:], castagnoli)
	dst = be.AppendUint32(dst, h.CRC)
	return dst, h
}

func recordSize(pageSize, n uint32) int64 {
	return recordHeaderSize + int64(n)*int64(4+pageSize) + recordTrailer
}

func decodeHeader(b []byte) (recordHeader, error) {
	var h recordHeader
	if len(b) < recordHeaderSize || string(b[:4]) != recordMagic {
		return h, fmt.Errorf("%w: bad record magic", ErrCorrupt)
	}
	be := binary.BigEndian
	if v := be.Uint32(b[4:]); v != recordVersion {
		return h, fmt.Errorf("%w: record version %d", ErrCorrupt, v)
	}
	h.PageSize = be.Uint32(b[8:])
	h.NPages = be.Uint32(b[12:])
	h.DBSize = be.Uint32(b[16:])
	h.PrevCRC = be.Uint32(b[20:])
	h.Txid = be.Uint64(b[24:])
	h.TimeUs = int64(be.Uint64(b[32:]))
	h.WAL = walPos{be.Uint32(b[40:]), be.Uint32(b[44:]), be.Uint32(b[48:]), be.Uint32(b[52:]), be.Uint32(b[56:])}
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
		size := recordSize(h.PageSize, h.NPages)
		if h.NPages > 1<<22 {
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
		pages := make([]page, h.NPages)
		stride := 4 + int(h.PageSize)
		for i := range pages {
			b := body[i*stride : (i+1)*stride]
			pages[i] = page{no: binary.BigEndian.Uint32(b), data: b[4:]}
		}
		if err := fn(h, pages); err != nil {
			return validBytes, err
		}
		validBytes += size
	}
}
