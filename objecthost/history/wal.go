package history

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The SQLite WAL file format (https://sqlite.org/fileformat2.html#walformat):
// a 32-byte header, then frames of a 24-byte header and one page. Frames are
// valid while their salts equal the header's and their cumulative checksum
// matches; a frame whose "commit size" is non-zero ends a transaction.

const (
	walHeaderSize      = 32
	walFrameHeaderSize = 24
	walMagicLE         = 0x377f0682
	walMagicBE         = 0x377f0683
)

// walPos is a position in one WAL: just after the commit frame number
// Frames (0: at the start) of the WAL whose salts are Salt1/Salt2, with the
// running checksum Ck0/Ck1 after that frame (the header's checksum at 0).
type walPos struct {
	Salt1, Salt2 uint32
	Frames       uint32
	Ck0, Ck1     uint32
}

type walHeader struct {
	bigEndian    bool
	pageSize     int
	salt1, salt2 uint32
	ck0, ck1     uint32
}

// walChecksum continues SQLite's WAL checksum over b (len multiple of 8).
func walChecksum(bigEndian bool, s0, s1 uint32, b []byte) (uint32, uint32) {
	var bo binary.ByteOrder = binary.LittleEndian
	if bigEndian {
		bo = binary.BigEndian
	}
	for i := 0; i+8 <= len(b); i += 8 {
		s0 += bo.Uint32(b[i:]) + s1
		s1 += bo.Uint32(b[i+4:]) + s0
	}
	return s0, s1
}

// readWALHeader reads and checks the header; ok is false for an empty or
// invalid WAL (SQLite treats both as "no frames").
func readWALHeader(f *os.File) (h walHeader, ok bool, err error) {
	var b [walHeaderSize]byte
	n, err := f.ReadAt(b[:], 0)
	if n < walHeaderSize {
		if err == nil || errors.Is(err, io.EOF) {
			return h, false, nil
		}
		return h, false, err
	}
	magic := binary.BigEndian.Uint32(b[0:])
	if magic != walMagicLE && magic != walMagicBE {
		return h, false, nil
	}
	h.bigEndian = magic == walMagicBE
	h.pageSize = int(binary.BigEndian.Uint32(b[8:]))
	if h.pageSize == 1 {
		h.pageSize = 65536
	}
	h.salt1 = binary.BigEndian.Uint32(b[16:])
	h.salt2 = binary.BigEndian.Uint32(b[20:])
	c0, c1 := walChecksum(h.bigEndian, 0, 0, b[:24])
	if c0 != binary.BigEndian.Uint32(b[24:]) || c1 != binary.BigEndian.Uint32(b[28:]) {
		return h, false, nil
	}
	h.ck0, h.ck1 = c0, c1
	return h, true, nil
}

// walTx is one committed transaction found in the WAL: the last version of
// each page it wrote, and the database size in pages after it. The page
// slices point into scanWAL's read buffer: they are valid only during the
// callback.
type walTx struct {
	pages  map[uint32][]byte
	dbSize uint32
	end    walPos // position after its commit frame
	// borrowed are the pages read in the current chunk: before the buffer
	// is reused for the next chunk, a transaction that goes on copies them.
	borrowed []uint32
}

// maxChunkFrames bounds one read of the WAL (and so the read buffer a
// capturer keeps): 64 frames, 256 KiB with 4 KiB pages.
const maxChunkFrames = 64

// scanWAL reads the committed transactions after from (which must be a
// position in the WAL with header h) and calls fn for each, in order. It
// stops at the first frame that is invalid (salts or checksum), which is
// where SQLite's own recovery would stop; frames of an uncommitted tail are
// never returned. *bufp is a read buffer reused between calls (may be nil).
//
// limit ≥ 0 is SQLite's mxFrame as its WAL hook reported it after a
// commit: frames after it are never read (they are a rolled-back
// transaction's, a transaction being written right now, or junk a killed
// process left half-written, which may even carry valid salts and a commit
// flag). Only with a limit may verify be false: every frame up to mxFrame
// was committed by this process or passed SQLite's own recovery, so the
// salts decide and the running checksum is taken from the frame headers.
// Without a limit (attach, after a crash, nothing writing) every checksum
// is verified, as SQLite's recovery does, and the scan stops at the first
// frame that fails.
func scanWAL(f *os.File, h walHeader, from walPos, verify bool, limit int, bufp *[]byte, fn func(*walTx) error) (walPos, error) {
	ps := h.pageSize
	frameSize := walFrameHeaderSize + ps
	pos := from
	tx := &walTx{pages: make(map[uint32][]byte)}
	s0, s1 := pos.Ck0, pos.Ck1
	frame := pos.Frames
	// Without a limit, read a few frames first (a point write adds 2–4),
	// then more while the transaction goes on.
	chunkFrames := 4
	var local []byte
	if bufp == nil {
		bufp = &local
	}
	buf := *bufp
	defer func() { *bufp = buf }()
	if limit < 0 {
		verify = true
	}
	for {
		if limit >= 0 {
			left := limit - int(frame)
			if left <= 0 {
				return pos, nil
			}
			chunkFrames = min(left, maxChunkFrames)
		}
		// The buffer is about to be overwritten: the transaction that goes
		// on keeps its own copies of the pages it read from it.
		for _, no := range tx.borrowed {
			tx.pages[no] = bytes.Clone(tx.pages[no])
		}
		tx.borrowed = tx.borrowed[:0]
		if cap(buf) < chunkFrames*frameSize {
			buf = make([]byte, chunkFrames*frameSize)
		}
		buf = buf[:chunkFrames*frameSize]
		off := int64(walHeaderSize) + int64(frame)*int64(frameSize)
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return pos, err
		}
		got := n / frameSize
		for i := 0; i < got; i++ {
			fb := buf[i*frameSize : (i+1)*frameSize : (i+1)*frameSize]
			if binary.BigEndian.Uint32(fb[8:]) != h.salt1 || binary.BigEndian.Uint32(fb[12:]) != h.salt2 {
				return pos, nil
			}
			c0, c1 := binary.BigEndian.Uint32(fb[16:]), binary.BigEndian.Uint32(fb[20:])
			if verify {
				v0, v1 := walChecksum(h.bigEndian, s0, s1, fb[:8])
				v0, v1 = walChecksum(h.bigEndian, v0, v1, fb[walFrameHeaderSize:])
				if v0 != c0 || v1 != c1 {
					return pos, nil
				}
			}
			s0, s1 = c0, c1
			frame++
			pgno := binary.BigEndian.Uint32(fb[0:])
			tx.pages[pgno] = fb[walFrameHeaderSize:]
			tx.borrowed = append(tx.borrowed, pgno)
			if commit := binary.BigEndian.Uint32(fb[4:]); commit != 0 {
				tx.dbSize = commit
				tx.end = walPos{Salt1: h.salt1, Salt2: h.salt2, Frames: frame, Ck0: s0, Ck1: s1}
				// Pages past the new end were truncated away by this
				// transaction (VACUUM-like shrink): drop them.
				for p := range tx.pages {
					if p > commit {
						delete(tx.pages, p)
					}
				}
				if err := fn(tx); err != nil {
					return pos, err
				}
				pos = tx.end
				clear(tx.pages)
				tx.borrowed = tx.borrowed[:0]
				tx.dbSize = 0
			}
		}
		if got < chunkFrames {
			return pos, nil
		}
		if limit < 0 && chunkFrames < maxChunkFrames {
			chunkFrames *= 4
		}
	}
}

// walStart is the position at the start of a WAL with header h.
func walStart(h walHeader) walPos {
	return walPos{Salt1: h.salt1, Salt2: h.salt2, Frames: 0, Ck0: h.ck0, Ck1: h.ck1}
}

// frameChecksumAt returns the running checksum stored in frame n (1-based)
// of the WAL, to check that a remembered position is still this WAL's.
func frameChecksumAt(f *os.File, h walHeader, n uint32) (c0, c1 uint32, ok bool, err error) {
	if n == 0 {
		return h.ck0, h.ck1, true, nil
	}
	frameSize := int64(walFrameHeaderSize + h.pageSize)
	var b [walFrameHeaderSize]byte
	m, err := f.ReadAt(b[:], int64(walHeaderSize)+int64(n-1)*frameSize)
	if m < walFrameHeaderSize {
		if err == nil || errors.Is(err, io.EOF) {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("history: read wal frame: %w", err)
	}
	if binary.BigEndian.Uint32(b[8:]) != h.salt1 || binary.BigEndian.Uint32(b[12:]) != h.salt2 {
		return 0, 0, false, nil
	}
	return binary.BigEndian.Uint32(b[16:]), binary.BigEndian.Uint32(b[20:]), true, nil
}
