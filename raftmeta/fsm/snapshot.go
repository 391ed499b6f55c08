package fsm

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"

	"github.com/hashicorp/raft"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// SnapshotMode chooses how Persist copies the catalog. Both modes read the
// same consistent state: Snapshot opens a read transaction (a WAL read
// snapshot) on a read connection and takes a view of the remembered request
// IDs (shared records, see dedupeView), and Persist copies from that
// transaction, then adds the request IDs to the copy, while Apply continues.
type SnapshotMode int

const (
	// SnapshotBackup copies the pages with SQLite's online backup API into a
	// temporary file next to the catalog, then streams the file to the sink.
	// Memory stays flat; the disk writes the catalog twice.
	SnapshotBackup SnapshotMode = iota
	// SnapshotSerialize copies the pages with sqlite3_serialize into memory
	// and writes them to the sink. Fastest, but holds the whole catalog in
	// memory (twice, briefly: the C buffer and the Go copy).
	SnapshotSerialize
)

// Snapshot stream format: magic, big-endian payload length, the SQLite
// database file, then a big-endian CRC-32C of the payload. The checksum lets
// Restore refuse a truncated or corrupted stream before touching the catalog.
const snapshotMagic = "SHOALFS1"

// maxSnapshotBytes bounds what Restore accepts (a corrupted length must not
// make it fill the disk).
const maxSnapshotBytes = 1 << 40

type snapshot struct {
	f     *FSM
	conn  *sql.Conn
	mode  SnapshotMode
	index uint64
	once  sync.Once
	// requests are the remembered request IDs at the pinned state (see
	// dedupe); Persist writes them into the copy's requests table.
	requests dedupeView
	// digests are the heartbeat digests at the pinned state (see
	// digestMem); Persist writes them into the copy's host_digests table.
	digests digestView
}

// Snapshot pins the current catalog state for Persist. It holds f.mu shared
// until Release, so Restore (and Close) wait for an in-flight Persist rather
// than pulling the file from under it.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	ctx := context.Background()
	f.mu.RLock()
	if f.closed || f.rdb == nil {
		f.mu.RUnlock()
		return nil, ErrClosed
	}
	conn, err := f.rdb.Conn(ctx)
	if err != nil {
		f.mu.RUnlock()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	s := &snapshot{f: f, conn: conn, mode: f.cfg.snapshotMode, requests: f.dd.view(),
		digests: f.dig.view()}
	// BEGIN is deferred; the first read is what pins the WAL read snapshot.
	// This is the checkpoint: from here on the copy sees exactly the state
	// after the last applied entry, whatever Apply commits next. (Snapshot
	// runs on the apply goroutine, between batches, so the request IDs and
	// digests viewed above are of that same state.)
	var v string
	if _, err = conn.ExecContext(ctx, `BEGIN`); err == nil {
		err = conn.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'applied_index'`).Scan(&v)
	}
	if err != nil {
		s.Release()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return s, nil
}

// Persist writes the pinned state to sink. It may run concurrently with
// Apply. It must not take f.mu again (the snapshot already holds it shared,
// and a waiting Restore would deadlock a second RLock).
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.persist(sink); err != nil {
		sink.Cancel() //nolint:errcheck // reporting the first error
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) persist(w io.Writer) error {
	switch s.mode {
	case SnapshotSerialize:
		var data []byte
		err := s.conn.Raw(func(dc any) error {
			var err error
			data, err = dc.(*sqlite3.SQLiteConn).Serialize("main")
			return err
		})
		if err != nil {
			return err
		}
		if len(s.requests.q) == 0 && len(s.digests.hosts) == 0 {
			return writeFramed(w, int64(len(data)), bytesReader(data))
		}
		// The remembered request IDs and the heartbeat digests go into
		// the copy's requests and host_digests tables,
		// which needs a file (an in-memory copy cannot grow): write the
		// image out, add them, and stream the file as backup mode does.
		path, err := s.tempCopy(func(path string) error { return os.WriteFile(path, data, 0o600) })
		if err != nil {
			return err
		}
		defer removeDBFiles(path) //nolint:errcheck // best effort cleanup of a temp file
		return streamFile(w, path)
	default:
		path, err := s.tempCopy(s.backupTo)
		if err != nil {
			return err
		}
		defer removeDBFiles(path) //nolint:errcheck // best effort cleanup of a temp file
		return streamFile(w, path)
	}
}

// tempCopy makes a temporary copy of the pinned catalog with fill, adds the
// remembered request IDs and the heartbeat digests to it, and returns its
// path (the caller removes it).
func (s *snapshot) tempCopy(fill func(path string) error) (string, error) {
	tmp, err := os.CreateTemp(s.f.dir, "snapshot-*.db")
	if err != nil {
		return "", err
	}
	path := tmp.Name()
	tmp.Close()
	err = fill(path)
	if err == nil {
		err = addMemoryState(path, s.requests, s.digests)
	}
	if err != nil {
		removeDBFiles(path) //nolint:errcheck // best effort cleanup of a temp file
		return "", err
	}
	return path, nil
}

// addMemoryState writes what the live catalog keeps in memory into the
// catalog file at path: the remembered request IDs into its requests
// table, the heartbeat digests into its host_digests table.
func addMemoryState(path string, v dedupeView, dv digestView) error {
	if len(v.q) == 0 && len(dv.hosts) == 0 {
		return nil
	}
	// Rollback-journal mode: the rows must be in the main file, which is
	// what gets streamed (the copy of a WAL-mode catalog would otherwise
	// write them into a -wal file beside it). Restore opens it in WAL mode.
	db, err := sql.Open("sqlite3", "file:"+path+"?_synchronous=OFF&_journal_mode=DELETE")
	if err != nil {
		return err
	}
	defer db.Close()
	if err := writeRequests(context.Background(), db, v); err != nil {
		return err
	}
	return writeDigests(context.Background(), db, dv)
}

func streamFile(w io.Writer, path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	return writeFramed(w, st.Size(), bufio.NewReaderSize(fh, 1<<20))
}

// backupTo copies the pinned read transaction's pages into a new file. The
// backup API reuses the source connection's open read transaction, so the
// copy is the pinned state even if Apply commits meanwhile.
func (s *snapshot) backupTo(path string) error {
	ctx := context.Background()
	dst, err := sql.Open("sqlite3", "file:"+path+"?_synchronous=OFF")
	if err != nil {
		return err
	}
	defer dst.Close()
	dconn, err := dst.Conn(ctx)
	if err != nil {
		return err
	}
	err = dconn.Raw(func(dd any) error {
		return s.conn.Raw(func(sd any) error {
			b, err := dd.(*sqlite3.SQLiteConn).Backup("main", sd.(*sqlite3.SQLiteConn), "main")
			if err != nil {
				return err
			}
			done, err := b.Step(-1)
			if ferr := b.Finish(); err == nil {
				err = ferr
			}
			if err == nil && !done {
				err = errors.New("backup did not complete")
			}
			return err
		})
	})
	if cerr := dconn.Close(); err == nil {
		err = cerr
	}
	return err
}

// Release ends the read transaction and lets Restore proceed.
func (s *snapshot) Release() {
	s.once.Do(func() {
		s.conn.ExecContext(context.Background(), `ROLLBACK`) //nolint:errcheck // ends a read txn; the conn is closed next
		s.conn.Close()
		s.requests.release()
		s.digests = digestView{}
		s.f.mu.RUnlock()
	})
}

type sliceReader struct{ b []byte }

func bytesReader(b []byte) io.Reader { return &sliceReader{b} }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func writeFramed(w io.Writer, n int64, r io.Reader) error {
	var hdr [16]byte
	copy(hdr[:8], snapshotMagic)
	binary.BigEndian.PutUint64(hdr[8:], uint64(n))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	copied, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, n))
	if err != nil {
		return err
	}
	if copied != n {
		return fmt.Errorf("snapshot source shrank: %d of %d bytes", copied, n)
	}
	var tail [4]byte
	binary.BigEndian.PutUint32(tail[:], h.Sum32())
	_, err = w.Write(tail[:])
	return err
}

// Restore replaces the catalog with a snapshot stream. Steps: (1) write the
// stream to a temporary file, checking the frame (length, CRC-32C, nothing
// after it); (2) migrate a catalog of an older schema version (migrateFile)
// and check the file is a catalog of this schema version
// (checkCatalogFile, without the integrity check: see CheckSnapshot);
// (3) under f.mu, move the old catalog aside, move the new one in, open it
// and load its request IDs; (4) remove the old one. Any failure before (4)
// puts the old catalog back and leaves it serving; bad input is always an error
// wrapping ErrInvalidSnapshot, never a panic. Raft calls Restore at start
// (newest snapshot first, skipping ones that fail), for InstallSnapshot and
// for a user restore (where an error makes raft panic, which is why
// raftmeta's restore runs CheckSnapshot before handing raft the bytes).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp, err := os.CreateTemp(f.dir, "restore-*.db")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	path := tmp.Name()
	swapped := false
	defer func() {
		if !swapped {
			removeDBFiles(path) //nolint:errcheck // best effort cleanup of a temp file
		}
	}()
	_, err = readFramed(bufio.NewReaderSize(rc, 1<<20), tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := migrateFile(context.Background(), path); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	_, level, err := checkCatalogFile(context.Background(), path, false)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if level > f.cfg.buildLevel {
		// Not bad input: a valid snapshot of a cluster this build is too
		// old for. Refusing it with an error would leave the replica
		// serving its old catalog and make raft try older snapshots (and
		// set this one aside at start, restore.go); halting keeps the
		// snapshot and stops the replica until it is upgraded, as Apply
		// does for set_cluster_level (BuildTooOldError).
		panic(&HaltError{Index: 0, Err: &BuildTooOldError{Build: f.cfg.buildLevel, Cluster: level}})
	}
	// Opening a WAL-mode payload for the checks can leave -wal/-shm files
	// beside it, which the rename below would orphan.
	if err := removeSidecars(path); err != nil {
		return fmt.Errorf("restore: %w", err)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	if err := f.closeHandles(); err != nil {
		return fmt.Errorf("restore: close catalog: %w", err)
	}
	// Closing the last connection checkpointed the WAL; the old catalog
	// (and any WAL left) moves aside under a name SQLite pairs the same
	// way, so it can come back if the new file does not open.
	old := f.path + ".pre-restore"
	if err := removeDBFiles(old); err != nil {
		return f.reopenAfter(fmt.Errorf("restore: %w", err))
	}
	if err := moveDBFiles(f.path, old); err != nil {
		if berr := moveDBFiles(old, f.path); berr != nil {
			return fmt.Errorf("restore: %w (and moving the old catalog back: %v)", err, berr)
		}
		return f.reopenAfter(fmt.Errorf("restore: %w", err))
	}
	if err := os.Rename(path, f.path); err != nil {
		return f.putBack(old, fmt.Errorf("restore: %w", err))
	}
	swapped = true
	// A failure to open or load what passed the checks is about the file
	// (its bytes are exactly what was sent): an invalid snapshot too.
	if err := f.open(); err != nil {
		return f.putBack(old, fmt.Errorf("restore: %w", notLoading(err)))
	}
	// The digests are read first and installed last, after loadDedupe
	// (which replaces the request IDs only once it has loaded them all):
	// after any failure the old catalog is put back with its own request
	// IDs and digests still in memory.
	digests, err := f.loadDigests(context.Background())
	if err != nil {
		f.closeHandles() //nolint:errcheck // reopening the old catalog next
		return f.putBack(old, fmt.Errorf("restore: %w", notLoading(err)))
	}
	if err := f.loadDedupe(context.Background()); err != nil {
		f.closeHandles() //nolint:errcheck // reopening the old catalog next
		return f.putBack(old, fmt.Errorf("restore: %w", notLoading(err)))
	}
	f.dig.replace(digests)
	removeDBFiles(old) //nolint:errcheck // best effort: New removes it on the next start anyway
	return nil
}

// reopenAfter reopens the (unchanged) catalog at f.path after a failed
// restore step and returns err. Callers hold f.mu.
func (f *FSM) reopenAfter(err error) error {
	if oerr := f.open(); oerr != nil {
		return fmt.Errorf("%w (and reopening the old catalog: %v)", err, oerr)
	}
	return err
}

// putBack replaces whatever is at f.path with the catalog moved aside to old
// and reopens it, returning err. Callers hold f.mu with the handles closed.
func (f *FSM) putBack(old string, err error) error {
	if rerr := removeDBFiles(f.path); rerr != nil {
		return fmt.Errorf("%w (and removing the restored file: %v)", err, rerr)
	}
	if merr := moveDBFiles(old, f.path); merr != nil {
		return fmt.Errorf("%w (and moving the old catalog back: %v)", err, merr)
	}
	return f.reopenAfter(err)
}

// moveDBFiles renames a SQLite file and its sidecars (the WAL and shared
// memory files, a rollback journal) from one name to another.
func moveDBFiles(from, to string) error {
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.Rename(from+suffix, to+suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func removeSidecars(path string) error {
	for _, p := range []string{path + "-wal", path + "-shm", path + "-journal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Frame sizes: magic + length before the payload, CRC-32C after it.
const (
	frameHeaderBytes = len(snapshotMagic) + 8
	frameOverhead    = int64(frameHeaderBytes + 4)
)

// readFramed copies the payload of a snapshot stream to w and returns its
// length. It reads r to its end: a stream with bytes after the checksum is
// refused like a truncated one. Refusals wrap ErrInvalidSnapshot and give
// byte positions; errors of r or w are returned as they are.
func readFramed(r io.Reader, w io.Writer) (int64, error) {
	var hdr [frameHeaderBytes]byte
	got, err := io.ReadFull(r, hdr[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, fmt.Errorf("read snapshot header: %w", err)
	}
	magic := hdr[:min(got, len(snapshotMagic))]
	switch {
	case got == 0:
		return 0, invalidSnapshot("empty (no snapshot header)")
	case !isMagicPrefix(magic):
		return 0, invalidSnapshot("not a catalog snapshot or backup (it does not start with %q)", snapshotMagic)
	case got < frameHeaderBytes:
		return 0, invalidSnapshot("truncated at byte %d of the %d-byte header", got, frameHeaderBytes)
	}
	n := binary.BigEndian.Uint64(hdr[len(snapshotMagic):])
	if n > maxSnapshotBytes {
		return 0, invalidSnapshot("the header gives a payload of %d bytes, over the %d-byte limit (corrupted header)", n, int64(maxSnapshotBytes))
	}
	total := frameOverhead + int64(n)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	cw := &errWriter{w: w}
	copied, err := io.Copy(io.MultiWriter(cw, h), io.LimitReader(r, int64(n)))
	if err != nil {
		if cw.err != nil {
			return 0, fmt.Errorf("write snapshot payload: %w", err)
		}
		return 0, fmt.Errorf("read snapshot: %w", err)
	}
	if copied < int64(n) {
		return 0, invalidSnapshot("truncated at byte %d of %d", int64(frameHeaderBytes)+copied, total)
	}
	var tail [4]byte
	got, err = io.ReadFull(r, tail[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, fmt.Errorf("read snapshot checksum: %w", err)
	}
	if got < len(tail) {
		return 0, invalidSnapshot("truncated at byte %d of %d (in the checksum)", int64(frameHeaderBytes)+int64(n)+int64(got), total)
	}
	if want, sum := binary.BigEndian.Uint32(tail[:]), h.Sum32(); want != sum {
		return 0, invalidSnapshot("checksum mismatch: the payload's CRC-32C is %08x, the file says %08x (corrupted)", sum, want)
	}
	extra, err := io.Copy(io.Discard, r)
	if err != nil {
		return 0, fmt.Errorf("read snapshot: %w", err)
	}
	if extra > 0 {
		return 0, invalidSnapshot("%d unexpected bytes after the end of the snapshot at byte %d", extra, total)
	}
	return int64(n), nil
}

// errWriter remembers whether the writer failed, so readFramed can tell
// a write error (the disk) from a read error (the source).
type errWriter struct {
	w   io.Writer
	err error
}

func (c *errWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}
