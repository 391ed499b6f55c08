package history

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Position is a state of a database in its log: the state after record
// Txid of generation Gen (Txid 0: the generation's base snapshot),
// committed at TimeUs.
type Position struct {
	Gen    string
	Txid   uint64
	TimeUs int64
}

// Time is the commit time of the position.
func (p Position) Time() time.Time { return time.UnixMicro(p.TimeUs).UTC() }

// A Bookmark names a Position the way D1's do
// ("00000085-0000024c-00004c6d-8e61…", 8-8-8-64 hex digits):
//
//	TTTTTTTT-tttttttt-xxxxxxxx-GGGGGGGGGGGGGGGGIIIIIIIIIIIIIIIICCCC…(32)
//
// T/t: the commit time in µs since the Unix epoch (high/low 32 bits), x:
// the low 32 bits of the txid, G: the generation, I: the txid, C: the first
// 16 bytes of SHA-256 over the database key and the rest, so a bookmark of
// another database or a mistyped one is refused instead of restoring
// something else. Commit times are strictly increasing per database across
// generations (capture enforces it), so bookmarks sort lexicographically in
// log order, and the time converts deterministically both ways: Time()
// reads it back, and the bookmark of a timestamp is that of the last commit
// at or before it (Archive.Resolve).
type Bookmark string

// ErrBadBookmark is returned for a bookmark that does not parse or does not
// belong to the database.
var ErrBadBookmark = errors.New("history: invalid bookmark")

// MakeBookmark returns the bookmark of p in database db.
func MakeBookmark(db string, p Position) Bookmark {
	t := uint64(p.TimeUs)
	head := fmt.Sprintf("%08x-%08x-%08x-%s%016x", t>>32, t&0xffffffff, p.Txid&0xffffffff, p.Gen, p.Txid)
	sum := sha256.Sum256([]byte(db + "\x00" + head))
	return Bookmark(head + hex.EncodeToString(sum[:16]))
}

// ParseBookmark checks b against database db and returns its position.
func ParseBookmark(db string, b Bookmark) (Position, error) {
	s := string(b)
	parts := strings.Split(s, "-")
	if len(parts) != 4 || len(parts[0]) != 8 || len(parts[1]) != 8 || len(parts[2]) != 8 || len(parts[3]) != 64 {
		return Position{}, ErrBadBookmark
	}
	hi, ok1 := parseHex16("00000000" + parts[0])
	lo, ok2 := parseHex16("00000000" + parts[1])
	gen := parts[3][:16]
	_, ok3 := parseHex16(gen)
	txid, ok4 := parseHex16(parts[3][16:32])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return Position{}, ErrBadBookmark
	}
	p := Position{Gen: gen, Txid: txid, TimeUs: int64(hi<<32 | lo)}
	if MakeBookmark(db, p) != b {
		return Position{}, ErrBadBookmark
	}
	return p, nil
}

// BookmarkTime returns the commit time a bookmark names without checking
// which database it belongs to.
func BookmarkTime(b Bookmark) (time.Time, error) {
	s := string(b)
	if len(s) < 17 || s[8] != '-' {
		return time.Time{}, ErrBadBookmark
	}
	hi, ok1 := parseHex16("00000000" + s[:8])
	lo, ok2 := parseHex16("00000000" + s[9:17])
	if !ok1 || !ok2 {
		return time.Time{}, ErrBadBookmark
	}
	return time.UnixMicro(int64(hi<<32 | lo)).UTC(), nil
}
