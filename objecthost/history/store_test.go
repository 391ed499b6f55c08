package history

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Store contract, for both implementations (S3 over loopback HTTP).
func TestStoreContract(t *testing.T) {
	dir, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	_, s3 := newS3(t)
	for name, s := range map[string]Store{"dir": dir, "s3": s3} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			_, err := s.Get(ctx, "a/none")
			assert.True(t, errors.Is(err, ErrNotFound), "%v", err)
			put := func(k, v string) {
				require.NoError(t, s.Put(ctx, k, bytes.NewReader([]byte(v)), int64(len(v))))
			}
			put("db1/g/seg/2.seg", "two")
			put("db1/g/seg/1.seg", "one")
			put("db10/g/seg/1.seg", "other db")
			put("db1/g/seg/1.seg", "one") // re-ship: same bytes, fine
			keys, err := s.List(ctx, "db1/")
			require.NoError(t, err)
			assert.Equal(t, []string{"db1/g/seg/1.seg", "db1/g/seg/2.seg"}, keys)
			r, err := s.Get(ctx, "db1/g/seg/2.seg")
			require.NoError(t, err)
			b, err := io.ReadAll(r)
			r.Close()
			require.NoError(t, err)
			assert.Equal(t, "two", string(b))
			require.NoError(t, s.Delete(ctx, "db1/g/seg/2.seg"))
			require.NoError(t, s.Delete(ctx, "db1/g/seg/2.seg"), "deleting a missing key is fine")
			keys, err = s.List(ctx, "db1/")
			require.NoError(t, err)
			assert.Equal(t, []string{"db1/g/seg/1.seg"}, keys)
		})
	}
}

// TestArchiveDatabases: both stores list the databases at the archive's
// top level (a delimited listing on S3, not every object), only valid
// keys; after DeleteAll a database is gone from the listing (a directory
// store prunes the empty directories).
func TestArchiveDatabases(t *testing.T) {
	dir, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	_, s3 := newS3(t)
	for name, s := range map[string]Store{"dir": dir, "s3": s3} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a := NewArchive(s)
			dbs, err := a.Databases(ctx)
			require.NoError(t, err)
			assert.Empty(t, dbs)
			u1, u2 := "0190a6d2-0000-7000-8000-000000000001", "0190a6d2-0000-7000-8000-000000000002"
			for _, k := range []string{u2 + "/g/seg/1.seg", u1 + "/g/seg/1.seg", u1 + "/g/snap/1.snap", u1 + "/h/seg/2.seg"} {
				require.NoError(t, s.Put(ctx, k, bytes.NewReader([]byte("x")), 1))
			}
			dbs, err = a.Databases(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{u1, u2}, dbs)
			n, err := a.DeleteAll(ctx, u1)
			require.NoError(t, err)
			assert.Equal(t, 3, n)
			dbs, err = a.Databases(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{u2}, dbs)
		})
	}
	_, err = NewArchive(storeWithoutListing{dir}).Databases(context.Background())
	assert.ErrorIs(t, err, ErrNoDatabaseListing)
}

// storeWithoutListing hides DatabaseLister.
type storeWithoutListing struct{ Store }

// TestDirStorePutFromFile: a Put from a file on the same filesystem links
// it (no second copy on the disk); the object stays intact when the local
// name is removed, a re-put of the same key works, and a file that cannot
// be linked (its name is gone) is copied.
func TestDirStorePutFromFile(t *testing.T) {
	root := t.TempDir()
	s, err := NewDirStore(filepath.Join(root, "archive"))
	require.NoError(t, err)
	ctx := context.Background()
	local := filepath.Join(root, "staging.seg")
	require.NoError(t, os.WriteFile(local, []byte("sealed segment"), 0o644))
	putFile := func(key string, size int64) {
		f, err := os.Open(local)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, s.Put(ctx, key, f, size))
	}
	putFile("db/g/seg/1.seg", 14)
	putFile("db/g/seg/1.seg", 14) // re-ship
	li, err := os.Stat(local)
	require.NoError(t, err)
	ai, err := os.Stat(s.path("db/g/seg/1.seg"))
	require.NoError(t, err)
	assert.True(t, os.SameFile(li, ai), "linked, not copied")
	require.NoError(t, os.Remove(local)) // the shipper removes the local file
	r, err := s.Get(ctx, "db/g/seg/1.seg")
	require.NoError(t, err)
	b, err := io.ReadAll(r)
	r.Close()
	require.NoError(t, err)
	assert.Equal(t, "sealed segment", string(b))

	// A file whose name is gone cannot be linked: copied from the
	// descriptor.
	require.NoError(t, os.WriteFile(local, []byte("0123456789"), 0o644))
	f, err := os.Open(local)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, os.Remove(local))
	require.NoError(t, s.Put(ctx, "db/g/seg/2.seg", f, 10))
	b, err = os.ReadFile(s.path("db/g/seg/2.seg"))
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(b))
	keys, err := s.List(ctx, "db/")
	require.NoError(t, err)
	assert.Equal(t, []string{"db/g/seg/1.seg", "db/g/seg/2.seg"}, keys, "no temporary names left")
}

func TestBookmarks(t *testing.T) {
	p := Position{Gen: genID(1_700_000_000_000_000), Txid: 42, TimeUs: 1_700_000_123_456_789}
	b := MakeBookmark("db", p)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{64}$`, string(b), "D1's shape")
	got, err := ParseBookmark("db", b)
	require.NoError(t, err)
	assert.Equal(t, p, got)
	tm, err := BookmarkTime(b)
	require.NoError(t, err)
	assert.Equal(t, p.Time(), tm)
	_, err = ParseBookmark("other", b)
	assert.ErrorIs(t, err, ErrBadBookmark, "another database's bookmark")
	bad := []byte(b)
	bad[30] ^= 1
	_, err = ParseBookmark("db", Bookmark(bad))
	assert.ErrorIs(t, err, ErrBadBookmark)
	// Later commits sort after, also across generations and 32-bit carries.
	later := []Position{{Gen: p.Gen, Txid: 43, TimeUs: p.TimeUs + 1}, {Gen: genID(p.TimeUs + 5), Txid: 0, TimeUs: p.TimeUs + 5}, {Gen: p.Gen, Txid: 44, TimeUs: p.TimeUs + 1<<32}}
	prev := b
	for _, q := range later {
		nb := MakeBookmark("db", q)
		assert.Less(t, string(prev), string(nb))
		prev = nb
	}
}

// TestRecordVersionsReadBack: records are written S2-compressed (version
// 2); version 1 records (uncompressed, archives written before) still read,
// in the same segment, with the same pages and the same chain.
func TestRecordVersionsReadBack(t *testing.T) {
	rnd := make([]byte, 4096)
	for i := range rnd {
		rnd[i] = byte(i*7919 + i>>3) // not very compressible
	}
	half := append(bytes.Repeat([]byte{0}, 2048), rnd[:2048]...)
	pages := map[uint32][]byte{9: rnd, 2: half}
	v1, h1 := encodeRecordRaw(nil, recordHeader{PageSize: 4096, DBSize: 9, Txid: 1, TimeUs: 10}, pages)
	seg, h2 := encodeRecordV2(bytes.Clone(v1), recordHeader{PageSize: 4096, DBSize: 9, PrevCRC: h1.CRC, Txid: 2, TimeUs: 11}, pages)
	assert.Less(t, len(seg)-len(v1), len(v1), "the compressed record is smaller")
	l2 := len(seg)
	seg, h3 := encodeRecord(seg, recordHeader{PageSize: 4096, DBSize: 9, PrevCRC: h2.CRC, Txid: 3, TimeUs: 12}, pages)
	var got []recordHeader
	n, err := readRecords(bytes.NewReader(seg), false, func(h recordHeader, ps []page) error {
		got = append(got, h)
		require.Len(t, ps, 2)
		assert.Equal(t, uint32(2), ps[0].no)
		assert.Equal(t, half, ps[0].data)
		assert.False(t, ps[0].patch)
		assert.Equal(t, uint32(9), ps[1].no)
		assert.Equal(t, rnd, ps[1].data)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, int64(len(seg)), n)
	require.Len(t, got, 3)
	assert.Equal(t, []uint32{h1.CRC, h2.CRC, h3.CRC}, []uint32{got[0].CRC, got[1].CRC, got[2].CRC})
	assert.Equal(t, h1.CRC, got[1].PrevCRC)
	assert.Equal(t, h2.CRC, got[2].PrevCRC)
	assert.Equal(t, int64(len(v1)), recordSize(got[0]))
	assert.Equal(t, int64(l2-len(v1)), recordSize(got[1]))
	assert.Equal(t, int64(len(seg)-l2), recordSize(got[2]))
}

// TestRecordPatches: with a page cache, a page that changed a little is
// stored as a patch against the version the previous record stored, a
// page that changed a lot (or is not cached) in full; replaying the
// records in order onto an image gives every version back exactly, and
// pages a commit truncated away are never patched against.
func TestRecordPatches(t *testing.T) {
	const ps = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	img := make([]byte, 8*ps) // the database as the records say
	var pc pageCache
	var seg []byte
	var want [][]byte // the image after each record
	var prev recordHeader
	dbSize := uint32(8)
	var gone []byte // the pages a shrink truncated away
	patched, full := 0, 0
	for txid := uint64(1); txid <= 300; txid++ {
		pages := map[uint32][]byte{}
		n := 1 + rng.IntN(3)
		switch txid % 50 {
		case 49, 0, 1: // only the pages below change around a shrink
			n = 0
		}
		for range n {
			no := uint32(1 + rng.IntN(int(dbSize)))
			pg := bytes.Clone(img[(no-1)*ps : no*ps])
			switch rng.IntN(4) {
			case 0: // rewrite most of it
				for i := range pg {
					pg[i] = byte(rng.Uint32())
				}
			default: // a few small edits
				for range 1 + rng.IntN(6) {
					off := rng.IntN(ps - 40)
					for i := range 1 + rng.IntN(40) {
						pg[off+i] = byte(rng.Uint32())
					}
				}
			}
			pages[no] = pg
		}
		switch txid % 50 {
		case 49: // pages 6–8 change a little: cached
			for no := uint32(6); no <= 8; no++ {
				pg := bytes.Clone(img[(no-1)*ps : no*ps])
				pg[100] ^= 1
				pages[no] = pg
			}
		case 0: // shrink to 5 pages (page 1 changes, the cache keeps 6–8 otherwise)
			dbSize = 5
			pg := bytes.Clone(img[:ps])
			pg[28] ^= 1
			pages[1] = pg
			gone = bytes.Clone(img[dbSize*ps:])
			clear(img[dbSize*ps:])
		}
		if txid%50 == 1 && gone != nil { // grown back: the commit writes the new pages
			dbSize = 8
			for no := uint32(6); no <= 8; no++ {
				// Close to the page that was truncated away (the worst case:
				// a stale cache entry would be patched against).
				pg := bytes.Clone(gone[(no-6)*ps : (no-5)*ps])
				pg[no] ^= 0xff
				pages[no] = pg
			}
		}
		h := recordHeader{PageSize: ps, DBSize: dbSize, PrevCRC: prev.CRC, Txid: txid, TimeUs: int64(txid)}
		seg, prev = encodeRecordWith(seg, h, pages, &pc)
		pc.dropAbove(dbSize)
		for no, pg := range pages {
			copy(img[(no-1)*ps:], pg)
		}
		want = append(want, bytes.Clone(img[:dbSize*ps]))
	}

	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	require.NoError(t, err)
	defer f.Close()
	var scratch []byte
	i := 0
	size := uint32(0)
	_, err = readRecords(bytes.NewReader(seg), false, func(h recordHeader, pgs []page) error {
		if h.DBSize < size {
			// What a restore from a snapshot taken here starts from: the
			// pages up to the end, nothing past it.
			require.NoError(t, f.Truncate(int64(h.DBSize)*ps))
		}
		size = h.DBSize
		for _, pg := range pgs {
			if pg.patch {
				patched++
				assert.Less(t, len(pg.data), ps/4+8)
			} else {
				full++
			}
			require.NoError(t, applyPage(f, ps, pg, &scratch))
		}
		got := make([]byte, h.DBSize*ps)
		n, _ := f.ReadAt(got, 0)
		clear(got[n:])
		require.Equal(t, want[i], got, "record %d", h.Txid)
		i++
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 300, i)
	assert.Positive(t, patched)
	assert.Positive(t, full)

	// A flipped byte inside a patch fails the CRC; a forged body with a
	// range past the page is refused even with a valid CRC.
	bad := bytes.Clone(seg)
	bad[len(bad)/2] ^= 1
	_, err = readRecords(bytes.NewReader(bad), false, func(recordHeader, []page) error { return nil })
	assert.ErrorIs(t, err, ErrCorrupt)
	forged := []byte{0, 0, 0, 1, pagePatch, 0, 1, 0x0f, 0xff, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8}
	_, err = decodeBodyV3(forged, recordHeader{PageSize: ps, NPages: 1})
	assert.ErrorIs(t, err, ErrCorrupt)
}

func TestRecordCorruptionDetected(t *testing.T) {
	pages := map[uint32][]byte{3: bytes.Repeat([]byte{1}, 512), 1: bytes.Repeat([]byte{2}, 512)}
	rec, h := encodeRecord(nil, recordHeader{PageSize: 512, DBSize: 3, Txid: 7, TimeUs: 99}, pages)
	var got []recordHeader
	_, err := readRecords(bytes.NewReader(rec), false, func(h recordHeader, ps []page) error {
		got = append(got, h)
		assert.Equal(t, uint32(1), ps[0].no, "pages ascending")
		return nil
	})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, h.CRC, got[0].CRC)
	for _, i := range []int{5, 70, len(rec) - 1} {
		bad := bytes.Clone(rec)
		bad[i] ^= 0x40
		_, err := readRecords(bytes.NewReader(bad), false, func(recordHeader, []page) error { return nil })
		assert.ErrorIs(t, err, ErrCorrupt, "flip at %d", i)
	}
	// A torn tail in a local file: the valid prefix is kept.
	two := append(bytes.Clone(rec), rec[:len(rec)-3]...)
	n, err := readRecords(bytes.NewReader(two), true, func(recordHeader, []page) error { return nil })
	require.NoError(t, err)
	assert.Equal(t, int64(len(rec)), n)
	_, err = readRecords(bytes.NewReader(two), false, func(recordHeader, []page) error { return nil })
	assert.ErrorIs(t, err, ErrCorrupt)
}
