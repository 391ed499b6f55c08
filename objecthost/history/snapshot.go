package history

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// A snapshot is a full image of the database after record Txid:
//
//	header (64 bytes, big-endian)
//	   0 magic "SHSN"   4 version (1)   8 page size   12 database size in pages
//	  16 txid           24 commit time (µs)            32 chain CRC: the CRC of
//	     record Txid (0 for a generation's base), which record Txid+1 carries
//	  36 reserved
//	pages 1..n, page size bytes each
//	trailer: CRC-32C of everything before it
//
// Snapshots are written from the live database without stopping it (see
// Capturer.Snapshot) and are what lets a restore replay a bounded amount.

const (
	snapMagic      = "SHSN"
	snapVersion    = 1
	snapHeaderSize = 64
)

type snapHeader struct {
	PageSize uint32
	DBSize   uint32
	Txid     uint64
	TimeUs   int64
	ChainCRC uint32
}

func snapSize(h snapHeader) int64 {
	return snapHeaderSize + int64(h.DBSize)*int64(h.PageSize) + 4
}

// writeSnapshot writes a snapshot to w, reading page n (1-based) with
// readPage into buf.
func writeSnapshot(w io.Writer, h snapHeader, readPage func(no uint32, buf []byte) error) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	crc := crc32.New(castagnoli)
	out := io.MultiWriter(bw, crc)
	var hb [snapHeaderSize]byte
	copy(hb[:], snapMagic)
	be := binary.BigEndian
	be.PutUint32(hb[4:], snapVersion)
	be.PutUint32(hb[8:], h.PageSize)
	be.PutUint32(hb[12:], h.DBSize)
	be.PutUint64(hb[16:], h.Txid)
	be.PutUint64(hb[24:], uint64(h.TimeUs))
	be.PutUint32(hb[32:], h.ChainCRC)
	if _, err := out.Write(hb[:]); err != nil {
		return err
	}
	buf := make([]byte, h.PageSize)
	for no := uint32(1); no <= h.DBSize; no++ {
		if err := readPage(no, buf); err != nil {
			return err
		}
		if _, err := out.Write(buf); err != nil {
			return err
		}
	}
	if _, err := bw.Write(be.AppendUint32(nil, crc.Sum32())); err != nil {
		return err
	}
	return bw.Flush()
}

// readSnapshot verifies a snapshot while copying its pages to dst (from
// offset 0) and returns its header. Nothing is trusted until the trailer
// checked out: callers write into a temporary file.
func readSnapshot(r io.Reader, dst io.Writer) (snapHeader, error) {
	var h snapHeader
	br := bufio.NewReaderSize(r, 256<<10)
	crc := crc32.New(castagnoli)
	var hb [snapHeaderSize]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return h, fmt.Errorf("%w: snapshot header: %v", ErrCorrupt, err)
	}
	if string(hb[:4]) != snapMagic || binary.BigEndian.Uint32(hb[4:]) != snapVersion {
		return h, fmt.Errorf("%w: bad snapshot magic", ErrCorrupt)
	}
	crc.Write(hb[:])
	be := binary.BigEndian
	h = snapHeader{PageSize: be.Uint32(hb[8:]), DBSize: be.Uint32(hb[12:]), Txid: be.Uint64(hb[16:]), TimeUs: int64(be.Uint64(hb[24:])), ChainCRC: be.Uint32(hb[32:])}
	if h.PageSize < 512 || h.PageSize > 65536 || h.PageSize&(h.PageSize-1) != 0 {
		return h, fmt.Errorf("%w: snapshot page size %d", ErrCorrupt, h.PageSize)
	}
	bw := bufio.NewWriterSize(dst, 256<<10)
	if _, err := io.CopyN(io.MultiWriter(bw, crc), br, int64(h.DBSize)*int64(h.PageSize)); err != nil {
		if errors.Is(err, io.EOF) {
			return h, fmt.Errorf("%w: truncated snapshot", ErrCorrupt)
		}
		return h, err
	}
	if err := bw.Flush(); err != nil {
		return h, err
	}
	var tb [4]byte
	if _, err := io.ReadFull(br, tb[:]); err != nil {
		return h, fmt.Errorf("%w: truncated snapshot", ErrCorrupt)
	}
	if be.Uint32(tb[:]) != crc.Sum32() {
		return h, fmt.Errorf("%w: snapshot checksum", ErrCorrupt)
	}
	return h, nil
}

// dbImage reads the database as of a captured WAL position: the database
// file overlaid with the WAL's frames 1..pos.Frames (the newest version of
// each page). It is consistent only while nothing checkpoints and the WAL
// is not restarted, which the caller guarantees (the writer goroutine, or
// Capturer.ckptMu held with the WAL not fully backfilled).
type dbImage struct {
	db, wal  *os.File
	pageSize int
	frames   map[uint32]int64 // page → offset of its newest frame's data
}

func newDBImage(db, wal *os.File, h walHeader, walOK bool, pos walPos, pageSize int) (*dbImage, error) {
	im := &dbImage{db: db, wal: wal, pageSize: pageSize, frames: make(map[uint32]int64)}
	if !walOK || pos.Frames == 0 || pos.Salt1 != h.salt1 || pos.Salt2 != h.salt2 {
		return im, nil
	}
	frameSize := int64(walFrameHeaderSize + h.pageSize)
	var fh [walFrameHeaderSize]byte
	for i := uint32(0); i < pos.Frames; i++ {
		off := walHeaderSize + int64(i)*frameSize
		if _, err := wal.ReadAt(fh[:], off); err != nil {
			return nil, fmt.Errorf("history: read wal for image: %w", err)
		}
		if binary.BigEndian.Uint32(fh[8:]) != h.salt1 || binary.BigEndian.Uint32(fh[12:]) != h.salt2 {
			return nil, fmt.Errorf("history: wal changed under an image")
		}
		im.frames[binary.BigEndian.Uint32(fh[0:])] = off + walFrameHeaderSize
	}
	return im, nil
}

func (im *dbImage) readPage(no uint32, buf []byte) error {
	if off, ok := im.frames[no]; ok {
		_, err := im.wal.ReadAt(buf, off)
		return err
	}
	n, err := im.db.ReadAt(buf, int64(no-1)*int64(im.pageSize))
	if n == len(buf) {
		return nil
	}
	if errors.Is(err, io.EOF) {
		// A page the file does not hold yet (allocated only in the WAL and
		// truncated, cannot happen for pages ≤ dbSize): zeros.
		clear(buf[n:])
		return nil
	}
	return err
}

// dbFileInfo reads the page size and page count from the database file's
// header (0, 0 for an empty file).
func dbFileInfo(db *os.File) (pageSize int, pages uint32, err error) {
	var b [100]byte
	n, err := db.ReadAt(b[:], 0)
	if n < 100 {
		if err == nil || errors.Is(err, io.EOF) {
			return 0, 0, nil
		}
		return 0, 0, err
	}
	pageSize = int(binary.BigEndian.Uint16(b[16:]))
	if pageSize == 1 {
		pageSize = 65536
	}
	pages = binary.BigEndian.Uint32(b[28:])
	// The header's count is valid when "version-valid-for" equals the
	// change counter; else use the file size.
	if binary.BigEndian.Uint32(b[92:]) != binary.BigEndian.Uint32(b[24:]) || pages == 0 {
		fi, err := db.Stat()
		if err != nil {
			return 0, 0, err
		}
		pages = uint32(fi.Size() / int64(pageSize))
	}
	return pageSize, pages, nil
}
