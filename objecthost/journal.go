package objecthost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/shoaldb/shoal/internal/durable"
)

// journal is the index's write-ahead log: two files used in turn, one per
// generation (generation g lives in file g%2, from offset 0). A commit
// appends one record holding a whole batch and fdatasyncs the file once;
// bbolt gets the batch later, in a checkpoint (index.go). The files are
// preallocated with zeros and reused, so an append inside the preallocated
// size does not change the file's size or allocation and the fdatasync has
// no metadata to commit.
//
// Record layout (little endian):
//
//	crc32c u32 | length u32 | generation u64 | payload [length]byte
//
// The checksum covers length, generation and payload. A reader stops at
// the first record that is short, has length 0, fails its checksum or
// belongs to another generation: a torn tail (a crash mid-append, never
// acknowledged), the zeros of a fresh file, or what an older generation
// left in a reused file. The payload is a sequence of ops:
//
//	put:    0x01 | uvarint len(key) | key | uvarint len(value) | value
//	remove: 0x02 | uvarint len(key) | key
//
// journal is not safe for concurrent use: the index's commit loop owns it.
type journal struct {
	files [2]*os.File
	gen   uint64 // generation being appended
	off   int64  // next append offset in files[gen%2]
	buf   []byte
	// sync makes an appended record durable: fdatasync; a test sets a
	// failing one to check what a failed commit leaves behind.
	sync func(*os.File) error
}

const (
	journalHeaderLen = 16
	// journalPrealloc is how much of each file is zero-filled up front.
	// The index checkpoints a generation well before it grows this big
	// (index.checkpointBytes); past it appends still work, and their
	// fdatasync also commits the new size.
	journalPrealloc = 2 << 20
	journalOpPut    = 1
	journalOpRemove = 2
)

var (
	journalCRC = crc32.MakeTable(crc32.Castagnoli)
	// errJournalCorrupt is a record that passed its checksum but does not
	// parse: a bug or a disk that returns wrong data, not a crash.
	errJournalCorrupt = errors.New("index journal record does not parse")
)

func journalPath(indexPath string, i int) string {
	return fmt.Sprintf("%s.journal.%d", indexPath, i)
}

// openJournalFiles opens (creating and preallocating where needed) the two
// journal files of the index at indexPath. A created file is zero-filled,
// fsynced, and its directory fsynced, before it is used.
func openJournalFiles(indexPath string) (*journal, error) {
	j := &journal{sync: fdatasync}
	created := false
	for i := range j.files {
		p := journalPath(indexPath, i)
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			j.close()
			return nil, fmt.Errorf("open index journal: %w", err)
		}
		j.files[i] = f
		st, err := f.Stat()
		if err != nil {
			j.close()
			return nil, fmt.Errorf("stat index journal: %w", err)
		}
		if st.Size() < journalPrealloc {
			if err := zeroFill(f, st.Size(), journalPrealloc); err != nil {
				j.close()
				return nil, fmt.Errorf("preallocate index journal: %w", err)
			}
			created = true
		}
	}
	if created {
		if err := durable.SyncDir(filepath.Dir(indexPath)); err != nil {
			j.close()
			return nil, fmt.Errorf("sync index directory: %w", err)
		}
	}
	return j, nil
}

// zeroFill writes zeros from off to size and fsyncs: written blocks, not
// fallocate's unwritten extents, whose first write is a metadata change
// that every fdatasync would have to commit.
func zeroFill(f *os.File, off, size int64) error {
	zeros := make([]byte, 256<<10)
	for off < size {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return f.Sync()
}

// replayOp is one op read back from the journal; value nil is a remove.
type replayOp struct {
	key, value []byte
}

// read returns the ops of generation gen in file gen%2, in order, up to
// the first record that ends the generation (see journal).
func (j *journal) read(gen uint64) ([]replayOp, error) { return readGeneration(j.files[gen%2], gen) }

func readGeneration(f *os.File, gen uint64) ([]replayOp, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var ops []replayOp
	for off := 0; ; {
		payload, next, ok := parseRecord(data, off, gen)
		if !ok {
			return ops, nil
		}
		ops, err = parseOps(ops, payload)
		if err != nil {
			return nil, fmt.Errorf("generation %d at offset %d: %w", gen, off, err)
		}
		off = next
	}
}

// parseRecord returns the payload of the record at off if it is a whole,
// intact record of generation gen.
func parseRecord(data []byte, off int, gen uint64) (payload []byte, next int, ok bool) {
	if len(data)-off < journalHeaderLen {
		return nil, 0, false
	}
	h := data[off : off+journalHeaderLen]
	n := int(binary.LittleEndian.Uint32(h[4:8]))
	if n == 0 || n > len(data)-off-journalHeaderLen {
		return nil, 0, false
	}
	if binary.LittleEndian.Uint64(h[8:16]) != gen {
		return nil, 0, false
	}
	end := off + journalHeaderLen + n
	if crc32.Checksum(data[off+4:end], journalCRC) != binary.LittleEndian.Uint32(h[0:4]) {
		return nil, 0, false
	}
	return data[off+journalHeaderLen : end], end, true
}

func parseOps(ops []replayOp, p []byte) ([]replayOp, error) {
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, false
		}
		v := p[k : k+int(n)]
		p = p[k+int(n):]
		return v, true
	}
	for len(p) > 0 {
		kind := p[0]
		p = p[1:]
		key, ok := field()
		if !ok {
			return nil, errJournalCorrupt
		}
		switch kind {
		case journalOpPut:
			v, ok := field()
			if !ok {
				return nil, errJournalCorrupt
			}
			ops = append(ops, replayOp{key: key, value: v})
		case journalOpRemove:
			ops = append(ops, replayOp{key: key})
		default:
			return nil, errJournalCorrupt
		}
	}
	return ops, nil
}

// start makes gen the generation being appended, from the start of its
// file. The caller guarantees that every op of generation gen-2 (the
// file's previous contents) is durable in bbolt.
func (j *journal) start(gen uint64) { j.gen, j.off = gen, 0 }

// begin starts a record in the append buffer; add ops with putOp and
// removeOp, then append.
func (j *journal) begin() { j.buf = append(j.buf[:0], make([]byte, journalHeaderLen)...) }

func (j *journal) putOp(key string, value []byte) {
	j.buf = append(j.buf, journalOpPut)
	j.buf = binary.AppendUvarint(j.buf, uint64(len(key)))
	j.buf = append(j.buf, key...)
	j.buf = binary.AppendUvarint(j.buf, uint64(len(value)))
	j.buf = append(j.buf, value...)
}

func (j *journal) removeOp(key string) {
	j.buf = append(j.buf, journalOpRemove)
	j.buf = binary.AppendUvarint(j.buf, uint64(len(key)))
	j.buf = append(j.buf, key...)
}

// append writes the record begun with begin and fdatasyncs it: when it
// returns nil, the record is durable. On an error the offset does not
// move, so the next record overwrites whatever part of this one reached
// the file and a reader never finds acknowledged records behind a torn
// one. A failed fdatasync does not stop the journal (PostgreSQL panics
// on one: Linux may mark the failed pages clean and report the error only
// once): every record before this one was fdatasynced before it was
// acknowledged, and the pages this one dirtied are written again, whole,
// by the next record, whose own fdatasync decides it. Until then the
// failed record's outcome is unknown, like any commit whose answer was an
// error: a crash may find it whole on disk and replay it (its caller was
// told it failed: a create then retries with new IDs, and the object left
// in the index is an orphan the catalog does not know, which dies as
// every failed creation's does).
func (j *journal) append() error {
	n := len(j.buf) - journalHeaderLen
	if n == 0 {
		return nil
	}
	binary.LittleEndian.PutUint32(j.buf[4:8], uint32(n))
	binary.LittleEndian.PutUint64(j.buf[8:16], j.gen)
	binary.LittleEndian.PutUint32(j.buf[0:4], crc32.Checksum(j.buf[4:], journalCRC))
	f := j.files[j.gen%2]
	if _, err := f.WriteAt(j.buf, j.off); err != nil {
		return fmt.Errorf("write index journal: %w", err)
	}
	if err := j.sync(f); err != nil {
		return fmt.Errorf("sync index journal: %w", err)
	}
	j.off += int64(len(j.buf))
	return nil
}

func (j *journal) close() error {
	var err error
	for i, f := range j.files {
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			j.files[i] = nil
		}
	}
	return err
}
