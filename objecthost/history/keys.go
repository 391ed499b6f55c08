package history

import (
	"fmt"
	"strings"
)

// Archive layout, per database (key = the database UUID, which survives
// moves between hosts):
//
//	<db>/<gen>/snap/<txid>-<time>.snap            full image after txid
//	<db>/<gen>/seg/<first>-<last>-<lasttime>.seg  records first..last
//	<db>/<gen>/prev/<prevgen>-<txid>-<time>.prev  the generation before
//	                                              gen reached txid (the
//	                                              name says it; the body
//	                                              repeats it as JSON)
//
// A prev marker (since 2026-12-03) is shipped before its generation's base
// snapshot when that generation supersedes another one of the same
// database (a restore, a relocation, an attach that could not prove
// continuity): it names how far the superseded generation reached (at
// least), so the scrubber finds a lost newest segment of a generation that
// nothing else names any more (scrub.go).
//
// gen, txid and times are 16 lower-case hex digits, so a listing sorts in
// log order. A generation is one unbroken lineage of records starting from
// its base snapshot (txid 0); a new one starts when continuity with the WAL
// cannot be proved (first attach, a gap after a crash) and on every
// restore. Generation IDs are their start time in µs, so generations sort
// by time too.

type segName struct {
	First, Last uint64
	LastTimeUs  int64
}

type snapName struct {
	Txid   uint64
	TimeUs int64
}

// prevName is a prev marker's name: generation Gen reached record Txid,
// committed at TimeUs.
type prevName struct {
	Gen    string
	Txid   uint64
	TimeUs int64
}

func (p prevName) file() string {
	return p.Gen + "-" + hex16(p.Txid) + "-" + hex16(uint64(p.TimeUs)) + ".prev"
}

func prevKey(db, gen string, p prevName) string { return db + "/" + gen + "/prev/" + p.file() }

func parsePrevName(base string) (prevName, bool) {
	base, ok := strings.CutSuffix(base, ".prev")
	if !ok {
		return prevName{}, false
	}
	parts := strings.Split(base, "-")
	if len(parts) != 3 {
		return prevName{}, false
	}
	if _, ok := parseHex16(parts[0]); !ok {
		return prevName{}, false
	}
	tx, ok1 := parseHex16(parts[1])
	tu, ok2 := parseHex16(parts[2])
	if !ok1 || !ok2 {
		return prevName{}, false
	}
	return prevName{Gen: parts[0], Txid: tx, TimeUs: int64(tu)}, true
}

func hex16(v uint64) string { return fmt.Sprintf("%016x", v) }

func genID(startUs int64) string { return hex16(uint64(startUs)) }

func segKey(db, gen string, s segName) string {
	return db + "/" + gen + "/seg/" + hex16(s.First) + "-" + hex16(s.Last) + "-" + hex16(uint64(s.LastTimeUs)) + ".seg"
}

func snapKey(db, gen string, s snapName) string {
	return db + "/" + gen + "/snap/" + hex16(s.Txid) + "-" + hex16(uint64(s.TimeUs)) + ".snap"
}

func parseHex16(s string) (uint64, bool) {
	if len(s) != 16 {
		return 0, false
	}
	var v uint64
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

func parseSegName(base string) (segName, bool) {
	base, ok := strings.CutSuffix(base, ".seg")
	parts := strings.Split(base, "-")
	if !ok || len(parts) != 3 {
		return segName{}, false
	}
	a, ok1 := parseHex16(parts[0])
	b, ok2 := parseHex16(parts[1])
	t, ok3 := parseHex16(parts[2])
	if !ok1 || !ok2 || !ok3 || b < a {
		return segName{}, false
	}
	return segName{First: a, Last: b, LastTimeUs: int64(t)}, true
}

func parseSnapName(base string) (snapName, bool) {
	base, ok := strings.CutSuffix(base, ".snap")
	parts := strings.Split(base, "-")
	if !ok || len(parts) != 2 {
		return snapName{}, false
	}
	a, ok1 := parseHex16(parts[0])
	t, ok2 := parseHex16(parts[1])
	if !ok1 || !ok2 {
		return snapName{}, false
	}
	return snapName{Txid: a, TimeUs: int64(t)}, true
}

// validKey reports whether a database key can name archive objects.
func validKey(k string) bool {
	if k == "" || len(k) > 128 {
		return false
	}
	for _, c := range []byte(k) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return k != "." && k != ".."
}
