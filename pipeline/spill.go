package pipeline

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The spill is an append-only log of records the producer could not hand to
// the broker, kept in a directory of segment files and replayed in append
// order. Layout of the directory:
//
//	LOCK                   flock(2)-held while a Producer owns the directory
//	epoch                  boot epoch (see BootEpoch; not the spill's)
//	cursor                 how far each segment has been replayed and acked
//	0000000100000000.seg   segments, named by a 16-hex-digit number;
//	0000000100000001.seg   replayed in ascending order
//
// A segment starts with the 8-byte magic "SHSPILL1" and holds frames:
//
//	u32 length of body (big endian)
//	u32 CRC-32C (Castagnoli) of body
//	body: u8 version (1) | i64 timestamp, Unix ms | u16 topic length | topic |
//	      i32 key length (-1: nil) | key | i32 value length (-1: nil) | value
//
// A frame whose length runs past the end of a segment or whose CRC does not
// match ends that segment for the reader (a torn tail after a crash, or
// corruption): the rest of the segment is skipped and counted, and replay
// goes on with the next one.
const (
	segMagic        = "SHSPILL1"
	segHeaderLen    = int64(len(segMagic))
	frameHeaderLen  = 8
	frameVersion    = 1
	firstSegNum     = uint64(1) << 32 // room below for prepended segments
	cursorFile      = "cursor"
	lockFile        = "LOCK"
	maxFrameBodyLen = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errSpillFull and errSpillQueueFull are the spill's refusals; the producer
// counts them as drops.
var (
	errSpillFull      = errors.New("spill full")
	errSpillQueueFull = errors.New("spill write queue full")
)

// ErrSpillLocked is returned by New when another Producer (in this process
// or another) holds the spill directory.
var ErrSpillLocked = errors.New("pipeline: spill directory in use by another producer")

// spillRecord is one record read back from the spill.
type spillRecord struct {
	topic      string
	key, value []byte
	ts         int64 // Unix ms
}

func frameLen(topic string, key, value []byte) int {
	return frameHeaderLen + 1 + 8 + 2 + len(topic) + 4 + len(key) + 4 + len(value)
}

func appendBytes32(b, v []byte) []byte {
	if v == nil {
		return binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// appendFrame appends one framed record to buf.
func appendFrame(buf []byte, topic string, key, value []byte, ts int64) []byte {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0, frameVersion)
	buf = binary.BigEndian.AppendUint64(buf, uint64(ts))
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(topic)))
	buf = append(buf, topic...)
	buf = appendBytes32(buf, key)
	buf = appendBytes32(buf, value)
	body := buf[start+frameHeaderLen:]
	binary.BigEndian.PutUint32(buf[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(buf[start+4:], crc32.Checksum(body, castagnoli))
	return buf
}

var errBadFrame = errors.New("malformed spill frame")

// decodeBody parses a frame body; key and value are copied out of body.
func decodeBody(body []byte) (spillRecord, error) {
	var r spillRecord
	if len(body) < 1+8+2 || body[0] != frameVersion {
		return r, errBadFrame
	}
	r.ts = int64(binary.BigEndian.Uint64(body[1:9]))
	tl := int(binary.BigEndian.Uint16(body[9:11]))
	rest := body[11:]
	if len(rest) < tl {
		return r, errBadFrame
	}
	r.topic = string(rest[:tl])
	rest = rest[tl:]
	var err error
	if r.key, rest, err = readBytes32(rest); err != nil {
		return r, err
	}
	if r.value, rest, err = readBytes32(rest); err != nil {
		return r, err
	}
	if len(rest) != 0 {
		return r, errBadFrame
	}
	return r, nil
}

func readBytes32(b []byte) (v, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, errBadFrame
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if n == 0xFFFFFFFF {
		return nil, b, nil
	}
	if uint64(len(b)) < uint64(n) {
		return nil, nil, errBadFrame
	}
	return bytes.Clone(b[:n]), b[n:], nil
}

// countFrames counts the frames in a buffer of whole frames.
func countFrames(b []byte) int {
	n := 0
	for len(b) >= frameHeaderLen {
		l := int(binary.BigEndian.Uint32(b))
		b = b[frameHeaderLen+l:]
		n++
	}
	return n
}

// segment is one spill file. size only grows while the segment is the
// writer's active one; consumed only grows (acknowledged replay).
type segment struct {
	num      uint64
	size     int64 // bytes written and readable
	consumed int64 // bytes replayed and acknowledged (≥ segHeaderLen)
	sealed   bool  // not the active segment: no more writes
}

func segName(num uint64) string { return fmt.Sprintf("%016x.seg", num) }

// spillPos is the end of one replayed frame: committing it marks the frame
// and everything before it in its segment as consumed.
type spillPos struct {
	seg *segment
	end int64
}

// spillStats is where the spill reports what it did.
type spillStats interface {
	spilled(records int, bytes int64)
	dropped(reason string, records int)
	corrupt(bytes int64)
}

type spillConfig struct {
	maxBytes  int64         // bound on unconsumed + queued bytes
	segBytes  int64         // roll the active segment past this size
	queueMax  int64         // bound on bytes waiting for the writer
	syncEvery time.Duration // 0: fsync after every write batch
}

// spill is the on-disk queue. Three parties use it, each from one
// goroutine: producers append (under Producer.mu or from the kgo promise
// goroutine, never concurrently with each other), the writer goroutine
// (run) moves appended frames to disk and does maintenance, and the replay
// goroutine reads (next, rewind). commit is called from the promise
// goroutine. s.mu guards the shared state; file I/O happens outside it.
type spill struct {
	dir   string
	cfg   spillConfig
	stats spillStats
	lock  *os.File

	// readable is kicked (non-blocking) whenever frames become readable.
	readable func()

	mu          sync.Mutex
	segs        []*segment // ascending num
	queue       []byte     // frames waiting for the writer
	spare       []byte
	writing     int64 // bytes of the batch the writer is writing
	unconsumed  int64 // Σ size-consumed over segs
	cursorDirty bool
	rseg        *segment // reader position
	roff        int64
	stopped     bool
	nextNum     uint64 // number of the next segment rolled at the end
	lowNum      uint64 // number of the next segment prepended at the start

	// writer-owned
	active     *os.File
	activeSeg  *segment
	unsynced   bool
	wakeWriter chan struct{}
	stop       chan struct{}
	done       chan struct{}

	// reader-owned
	rf     *os.File
	rfSeg  *segment
	rbuf   []byte
	rstart int64 // file offset of rbuf[0]
}

// openSpill opens (creating) the spill directory, locks it, and loads the
// segments and cursor left by a previous Producer.
func openSpill(dir string, cfg spillConfig, stats spillStats, readable func()) (*spill, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("spill dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("spill lock: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrSpillLocked, dir)
		}
		return nil, fmt.Errorf("spill lock: %w", err)
	}
	s := &spill{
		dir: dir, cfg: cfg, stats: stats, lock: lf, readable: readable,
		wakeWriter: make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		rbuf:       make([]byte, 0, 256<<10),
	}
	if err := s.load(); err != nil {
		lf.Close()
		return nil, err
	}
	go s.run()
	return s, nil
}

func (s *spill) load() error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("spill dir: %w", err)
	}
	cursor := readCursor(filepath.Join(s.dir, cursorFile))
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".seg") || len(name) != 16+4 {
			continue
		}
		num, err := strconv.ParseUint(strings.TrimSuffix(name, ".seg"), 16, 64)
		if err != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("spill segment %s: %w", name, err)
		}
		seg := &segment{num: num, size: fi.Size(), consumed: segHeaderLen, sealed: true}
		if c, ok := cursor[num]; ok && c > seg.consumed {
			seg.consumed = min(c, seg.size)
		}
		if seg.consumed >= seg.size {
			os.Remove(filepath.Join(s.dir, name))
			continue
		}
		s.segs = append(s.segs, seg)
		s.unconsumed += seg.size - seg.consumed
	}
	slices.SortFunc(s.segs, func(a, b *segment) int { return cmpUint(a.num, b.num) })
	s.nextNum, s.lowNum = firstSegNum, firstSegNum-1
	if n := len(s.segs); n > 0 {
		s.rseg, s.roff = s.segs[0], s.segs[0].consumed
		s.nextNum, s.lowNum = s.segs[n-1].num+1, s.segs[0].num-1
	}
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// backlog is the unconsumed bytes on disk plus those waiting to be written.
func (s *spill) backlog() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unconsumed + int64(len(s.queue)) + s.writing
}

func (s *spill) queued() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.queue)) + s.writing
}

// drained reports whether everything ever appended has been written,
// replayed and acknowledged.
func (s *spill) drained() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) == 0 && s.writing == 0 && s.unconsumed == 0
}

// append queues one record for the writer. It never waits on the disk.
func (s *spill) append(topic string, key, value []byte, ts int64) error {
	n := int64(frameLen(topic, key, value))
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errSpillFull
	}
	if s.unconsumed+int64(len(s.queue))+s.writing+n > s.cfg.maxBytes {
		s.mu.Unlock()
		return errSpillFull
	}
	if int64(len(s.queue))+n > s.cfg.queueMax {
		s.mu.Unlock()
		return errSpillQueueFull
	}
	s.queue = appendFrame(s.queue, topic, key, value, ts)
	s.mu.Unlock()
	select {
	case s.wakeWriter <- struct{}{}:
	default:
	}
	return nil
}

// run is the writer goroutine: it writes queued frames, fsyncs by policy,
// persists the cursor, deletes consumed segments and retires a fully
// consumed active segment.
func (s *spill) run() {
	defer close(s.done)
	tick := s.cfg.syncEvery
	if tick <= 0 {
		tick = time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-s.wakeWriter:
			s.writeQueued()
		case <-t.C:
			s.writeQueued()
			s.maintain(true)
		case <-s.stop:
			s.writeQueued()
			s.maintain(false)
			s.syncActive()
			if s.active != nil {
				s.active.Close()
				s.active = nil
			}
			return
		}
	}
}

func (s *spill) writeQueued() {
	s.mu.Lock()
	batch := s.queue
	s.queue = s.spare[:0]
	s.spare = nil
	s.writing = int64(len(batch))
	s.mu.Unlock()
	if len(batch) == 0 {
		s.mu.Lock()
		s.spare = batch
		s.mu.Unlock()
		return
	}
	orig := batch
	wrote := false
	for len(batch) > 0 {
		// Cut a chunk of whole frames that fits the active segment (at
		// least one frame, however large).
		room := int64(-1)
		if s.activeSeg != nil {
			room = s.cfg.segBytes - s.activeSeg.size
		}
		cut := 0
		for cut < len(batch) {
			l := frameHeaderLen + int(binary.BigEndian.Uint32(batch[cut:]))
			if cut > 0 && int64(cut+l) > room {
				break
			}
			cut += l
		}
		if s.activeSeg == nil || (s.activeSeg.size > segHeaderLen && int64(cut) > room) {
			if err := s.roll(); err != nil {
				s.stats.dropped(dropSpillError, countFrames(batch))
				break
			}
			continue // recompute the cut for the new segment
		}
		chunk := batch[:cut]
		if _, err := s.active.Write(chunk); err != nil {
			s.stats.dropped(dropSpillError, countFrames(chunk))
			// Take the partial write back; if that fails too, seal
			// the segment where the valid frames end.
			// (The file is O_APPEND: the next write lands at the
			// truncated end.)
			if terr := s.active.Truncate(s.activeSeg.size); terr != nil {
				s.sealActive()
			}
		} else {
			s.mu.Lock()
			s.activeSeg.size += int64(len(chunk))
			s.unconsumed += int64(len(chunk))
			s.writing -= int64(len(chunk))
			s.mu.Unlock()
			s.stats.spilled(countFrames(chunk), int64(len(chunk)))
			s.unsynced = true
			wrote = true
		}
		batch = batch[cut:]
	}
	if s.cfg.syncEvery <= 0 {
		s.syncActive()
	}
	s.mu.Lock()
	s.writing = 0
	if s.spare == nil {
		s.spare = orig[:0]
	}
	s.mu.Unlock()
	if wrote && s.readable != nil {
		s.readable()
	}
}

// roll seals the active segment (fsynced) and opens the next one.
func (s *spill) roll() error {
	s.sealActive()
	s.mu.Lock()
	num := s.nextNum
	s.nextNum++
	s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(s.dir, segName(num)), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("spill segment: %w", err)
	}
	if _, err := f.Write([]byte(segMagic)); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("spill segment: %w", err)
	}
	syncDir(s.dir)
	seg := &segment{num: num, size: segHeaderLen, consumed: segHeaderLen}
	s.active, s.activeSeg = f, seg
	s.unsynced = true
	s.mu.Lock()
	s.segs = append(s.segs, seg)
	if s.rseg == nil {
		s.rseg, s.roff = seg, seg.consumed
	}
	s.mu.Unlock()
	return nil
}

func (s *spill) sealActive() {
	if s.active == nil {
		return
	}
	s.syncActive()
	s.active.Close()
	s.mu.Lock()
	s.activeSeg.sealed = true
	s.mu.Unlock()
	s.active, s.activeSeg = nil, nil
}

func (s *spill) syncActive() {
	if s.active != nil && s.unsynced {
		s.active.Sync()
		s.unsynced = false
	}
}

// maintain persists the cursor and deletes segments that are fully
// consumed. With retire, an active segment that is fully consumed and has
// nothing waiting is sealed too, so an idle spill holds no files.
func (s *spill) maintain(retire bool) {
	if retire && s.activeSeg != nil {
		s.mu.Lock()
		idle := len(s.queue) == 0 && s.activeSeg.consumed >= s.activeSeg.size
		s.mu.Unlock()
		if idle {
			s.sealActive()
		}
	}
	s.mu.Lock()
	var gone []*segment
	keep := s.segs[:0]
	for _, seg := range s.segs {
		if seg.sealed && seg.consumed >= seg.size {
			gone = append(gone, seg)
			continue
		}
		keep = append(keep, seg)
	}
	clear(s.segs[len(keep):])
	s.segs = keep
	var cur []byte
	if s.cursorDirty || len(gone) > 0 {
		cur = encodeCursor(s.segs)
		s.cursorDirty = false
	}
	s.mu.Unlock()
	if cur != nil {
		writeFileAtomic(filepath.Join(s.dir, cursorFile), cur, false)
	}
	for _, seg := range gone {
		os.Remove(filepath.Join(s.dir, segName(seg.num)))
	}
}

// commit marks everything up to pos as replayed and acknowledged. Commits
// arrive in read order.
func (s *spill) commit(pos spillPos) {
	s.mu.Lock()
	if pos.end > pos.seg.consumed {
		s.unconsumed -= pos.end - pos.seg.consumed
		pos.seg.consumed = pos.end
		s.cursorDirty = true
	}
	s.mu.Unlock()
}

// readStatus is what next found.
type readStatus int

const (
	readNone readStatus = iota // nothing readable yet
	readOK                     // a record
	readSkip                   // an unreadable stretch up to pos (counted); commit it
)

// next reads the record at the reader position. Only the replay goroutine
// calls next and rewind.
func (s *spill) next() (spillRecord, spillPos, readStatus) {
	for {
		s.mu.Lock()
		seg, off := s.rseg, s.roff
		if seg == nil {
			s.mu.Unlock()
			return spillRecord{}, spillPos{}, readNone
		}
		limit, sealed := seg.size, seg.sealed
		if off >= limit {
			if !sealed {
				s.mu.Unlock()
				return spillRecord{}, spillPos{}, readNone
			}
			// The next segment by number (seg itself may already be
			// deleted from segs once fully consumed).
			i := slices.IndexFunc(s.segs, func(x *segment) bool { return x.num > seg.num })
			if i < 0 {
				s.mu.Unlock()
				return spillRecord{}, spillPos{}, readNone
			}
			s.rseg, s.roff = s.segs[i], s.segs[i].consumed
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()

		rec, end, err := s.readAt(seg, off, limit)
		s.mu.Lock()
		if s.rseg == seg && s.roff == off { // not rewound meanwhile
			s.roff = end
		}
		s.mu.Unlock()
		if err != nil {
			s.stats.corrupt(end - off)
			return spillRecord{}, spillPos{seg: seg, end: end}, readSkip
		}
		return rec, spillPos{seg: seg, end: end}, readOK
	}
}

// readAt reads the frame at off in seg; on a bad frame it returns an error
// and limit (the rest of the segment is skipped).
func (s *spill) readAt(seg *segment, off, limit int64) (spillRecord, int64, error) {
	if s.rfSeg != seg {
		if s.rf != nil {
			s.rf.Close()
			s.rf, s.rfSeg = nil, nil
		}
		f, err := os.Open(filepath.Join(s.dir, segName(seg.num)))
		if err != nil {
			return spillRecord{}, limit, err
		}
		var magic [segHeaderLen]byte
		if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != segMagic {
			f.Close()
			return spillRecord{}, limit, errBadFrame
		}
		s.rf, s.rfSeg = f, seg
		s.rbuf, s.rstart = s.rbuf[:0], 0
	}
	hdr, err := s.window(off, frameHeaderLen, limit)
	if err != nil {
		return spillRecord{}, limit, err
	}
	n := int64(binary.BigEndian.Uint32(hdr))
	sum := binary.BigEndian.Uint32(hdr[4:])
	if n > maxFrameBodyLen || off+frameHeaderLen+n > limit {
		return spillRecord{}, limit, errBadFrame
	}
	fr, err := s.window(off, int(frameHeaderLen+n), limit)
	if err != nil {
		return spillRecord{}, limit, err
	}
	body := fr[frameHeaderLen:]
	if crc32.Checksum(body, castagnoli) != sum {
		return spillRecord{}, limit, errBadFrame
	}
	rec, err := decodeBody(body)
	if err != nil {
		return spillRecord{}, limit, err
	}
	return rec, off + frameHeaderLen + n, nil
}

// window returns n bytes at file offset off, refilling the read buffer
// from the file (never past limit) when they are not in it.
func (s *spill) window(off int64, n int, limit int64) ([]byte, error) {
	if off >= s.rstart && off+int64(n) <= s.rstart+int64(len(s.rbuf)) {
		i := off - s.rstart
		return s.rbuf[i : i+int64(n)], nil
	}
	want := max(n, cap(s.rbuf))
	if int64(want) > limit-off {
		want = int(limit - off)
	}
	if want < n {
		return nil, io.ErrUnexpectedEOF
	}
	if cap(s.rbuf) < want {
		s.rbuf = make([]byte, want)
	}
	s.rbuf = s.rbuf[:want]
	got, err := s.rf.ReadAt(s.rbuf, off)
	s.rbuf, s.rstart = s.rbuf[:got], off
	if got < n {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return s.rbuf[:n], nil
}

// rewind moves the reader back to the first unacknowledged byte, after a
// replayed record failed and every in-flight one has settled.
func (s *spill) rewind() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rseg, s.roff = nil, 0
	for _, seg := range s.segs {
		if seg.consumed < seg.size || !seg.sealed {
			s.rseg, s.roff = seg, seg.consumed
			return
		}
	}
}

// close stops the writer (writing what is queued), writes head — frames
// older than everything in the spill — as a new first segment, persists
// the cursor and releases the directory. It returns the first error.
func (s *spill) close(head []byte) error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	var errs []error
	if len(head) > 0 {
		if err := s.prepend(head); err != nil {
			s.stats.dropped(dropShutdown, countFrames(head))
			errs = append(errs, err)
		} else {
			s.stats.spilled(countFrames(head), int64(len(head)))
		}
	}
	s.mu.Lock()
	cur := encodeCursor(s.segs)
	s.mu.Unlock()
	if err := writeFileAtomic(filepath.Join(s.dir, cursorFile), cur, true); err != nil {
		errs = append(errs, err)
	}
	if s.rf != nil {
		s.rf.Close()
	}
	s.lock.Close() // releases the flock
	return errors.Join(errs...)
}

// prepend writes frames — older than everything in the spill — as a new
// first segment (fsynced). The reader must be rewound afterwards to read
// them first; the replay goroutine and close call it, never concurrently.
func (s *spill) prepend(frames []byte) error {
	s.mu.Lock()
	num := s.lowNum
	s.lowNum--
	s.mu.Unlock()
	buf := make([]byte, 0, len(segMagic)+len(frames))
	buf = append(append(buf, segMagic...), frames...)
	if err := writeFileAtomic(filepath.Join(s.dir, segName(num)), buf, true); err != nil {
		return fmt.Errorf("spill prepend: %w", err)
	}
	seg := &segment{num: num, size: int64(len(buf)), consumed: segHeaderLen, sealed: true}
	s.mu.Lock()
	s.segs = append([]*segment{seg}, s.segs...)
	s.unconsumed += seg.size - seg.consumed
	s.mu.Unlock()
	return nil
}

// The cursor file: a header line, "num consumed" lines (hex num, decimal
// offset) for segments with anything consumed, and a CRC-32C line over the
// lines before it. A missing or damaged cursor replays whole segments:
// duplicates, which consumers drop by event ID, never loss.
const cursorHeader = "shoal-spill-cursor 1\n"

func encodeCursor(segs []*segment) []byte {
	var b bytes.Buffer
	b.WriteString(cursorHeader)
	for _, seg := range segs {
		if seg.consumed > segHeaderLen {
			fmt.Fprintf(&b, "%016x %d\n", seg.num, seg.consumed)
		}
	}
	fmt.Fprintf(&b, "crc %08x\n", crc32.Checksum(b.Bytes(), castagnoli))
	return b.Bytes()
}

func readCursor(path string) map[uint64]int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	i := bytes.LastIndex(raw, []byte("crc "))
	if i < 0 || !bytes.HasPrefix(raw, []byte(cursorHeader)) {
		return nil
	}
	want, err := strconv.ParseUint(strings.TrimSpace(string(raw[i+4:])), 16, 32)
	if err != nil || crc32.Checksum(raw[:i], castagnoli) != uint32(want) {
		return nil
	}
	out := make(map[uint64]int64)
	sc := bufio.NewScanner(bytes.NewReader(raw[len(cursorHeader):i]))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			return nil
		}
		num, err1 := strconv.ParseUint(f[0], 16, 64)
		off, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil
		}
		out[num] = off
	}
	return out
}

// writeFileAtomic writes path through a temporary file and a rename, with
// fsyncs of the file and the directory when durable.
func writeFileAtomic(path string, data []byte, durable bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if durable {
		syncDir(filepath.Dir(path))
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
