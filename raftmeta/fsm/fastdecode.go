package fsm

import (
	"encoding/json"
	"math"
	"strconv"
)

// Fast paths for decoding the hottest log entries: create_database, and
// set_database_stats (few entries, but thousands of sizes each).
//
// Every command in the log — an entry's data, or one command of a batch
// entry (batchentry.go) — is json.Marshal(Command) (the HTTP API and
// Node.Apply re-encode what they accept), so in practice commands are in
// canonical form: no whitespace, keys exactly as tagged, plain ASCII
// strings. decodeCreateFast and decodeStatsFast parse exactly that form in
// one pass (the envelope and the body together, no reflection). Anything
// else — another command type, an unknown, duplicate or differently-cased
// key, an escape, a non-ASCII byte, whitespace, null, a number that is not a
// plain integer — makes them decline, and applyOne decodes with
// encoding/json as before. On what they accept they yield exactly what
// encoding/json yields (TestDecodeCreateFastMatchesJSON,
// FuzzDecodeCreateFast, TestDecodeStatsFastMatchesJSON,
// FuzzDecodeStatsFast), so replicas with and without the fast paths apply
// identically.

type fastParser struct {
	data []byte
	p    int
}

func (fp *fastParser) byte(c byte) bool {
	if fp.p < len(fp.data) && fp.data[fp.p] == c {
		fp.p++
		return true
	}
	return false
}

// str parses a string of printable ASCII without escapes.
func (fp *fastParser) str() (string, bool) {
	if !fp.byte('"') {
		return "", false
	}
	start := fp.p
	for fp.p < len(fp.data) {
		c := fp.data[fp.p]
		switch {
		case c == '"':
			s := string(fp.data[start:fp.p])
			fp.p++
			return s, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", false
		}
		fp.p++
	}
	return "", false
}

// int parses -?(0|[1-9][0-9]*) of at most maxDigits (≤ 19) digits whose
// magnitude fits in an int64.
func (fp *fastParser) int(maxDigits int) (int64, bool) {
	neg := fp.byte('-')
	start := fp.p
	var u uint64 // 19 decimal digits always fit
	for fp.p < len(fp.data) && fp.data[fp.p] >= '0' && fp.data[fp.p] <= '9' {
		if fp.p-start >= maxDigits {
			return 0, false
		}
		u = u*10 + uint64(fp.data[fp.p]-'0')
		fp.p++
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	n := int64(u)
	digits := fp.p - start
	if digits == 0 || (digits > 1 && fp.data[start] == '0') {
		return 0, false
	}
	if fp.p < len(fp.data) {
		if c := fp.data[fp.p]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}

// object parses {"key":value,...}, calling field for each key (which parses
// the value and reports whether it accepted it). Duplicate keys decline.
func (fp *fastParser) object(field func(key string, seen *uint32) bool) bool {
	if !fp.byte('{') {
		return false
	}
	var seen uint32
	if fp.byte('}') {
		return true
	}
	for {
		k, ok := fp.str()
		if !ok || !fp.byte(':') || !field(k, &seen) {
			return false
		}
		if fp.byte('}') {
			return true
		}
		if !fp.byte(',') {
			return false
		}
	}
}

// once marks bit in seen, declining a key met twice.
func once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// envelopeFast parses a canonical Command envelope, handing the body's
// bytes to body (which parses them with fp and reports whether it
// accepted them); ok=false means "use encoding/json" (never "invalid").
func envelopeFast(data []byte, body func(fp *fastParser) bool) (cmd Command, ok bool) {
	fp := &fastParser{data: data}
	hasBody := false
	ok = fp.object(func(key string, seen *uint32) bool {
		switch key {
		case "v":
			v, ok := fp.int(9)
			cmd.Version = int(v)
			return ok && once(seen, 1)
		case "type":
			s, ok := fp.str()
			cmd.Type = CommandType(s)
			return ok && once(seen, 2)
		case "rid":
			s, ok := fp.str()
			cmd.RequestID = s
			return ok && once(seen, 4)
		case "ts":
			v, ok := fp.int(19)
			cmd.Time = v
			return ok && once(seen, 8)
		case "body":
			start := fp.p
			if !body(fp) {
				return false
			}
			cmd.Body = data[start:fp.p]
			hasBody = true
			return once(seen, 16)
		case "audit":
			a := &Audit{}
			cmd.Audit = a
			return once(seen, 32) && fp.object(func(key string, seen *uint32) bool {
				s, ok := fp.str()
				switch key {
				case "actor":
					a.Actor = s
					return ok && once(seen, 1)
				case "source":
					a.Source = s
					return ok && once(seen, 2)
				}
				return false
			})
		}
		return false
	})
	if !ok || fp.p != len(data) || !hasBody {
		return Command{}, false
	}
	return cmd, true
}

// decodeCreateFast decodes a canonical create_database entry; ok=false means
// "use encoding/json" (never "invalid").
func decodeCreateFast(data []byte) (cmd Command, body CreateDatabase, ok bool) {
	cmd, ok = envelopeFast(data, func(fp *fastParser) bool {
		return fp.object(func(key string, seen *uint32) bool {
			var dst *string
			var bit uint32
			switch key {
			case "uuid":
				dst, bit = &body.UUID, 1
			case "account_id":
				dst, bit = &body.AccountID, 2
			case "name":
				dst, bit = &body.Name, 4
			case "object_id":
				dst, bit = &body.ObjectID, 8
			case "host_id":
				dst, bit = &body.HostID, 16
			case "region":
				dst, bit = &body.Region, 32
			case "jurisdiction":
				dst, bit = &body.Jurisdiction, 64
			case "read_replication":
				dst, bit = &body.ReadReplication, 128
			default:
				return false
			}
			s, ok := fp.str()
			*dst = s
			return ok && once(seen, bit)
		})
	})
	if !ok || cmd.Type != CmdCreateDatabase {
		return Command{}, CreateDatabase{}, false
	}
	return cmd, body, true
}

// decodeStatsFast decodes a canonical set_database_stats entry (the storage
// consumer's batches of thousands of sizes, where encoding/json's two
// passes, envelope then body, were an eighth of the FSM's cost per size);
// ok=false means "use encoding/json".
func decodeStatsFast(data []byte) (cmd Command, body SetDatabaseStats, ok bool) {
	cmd, ok = envelopeFast(data, func(fp *fastParser) bool {
		return fp.object(func(key string, seen *uint32) bool {
			if key != "stats" || !once(seen, 1) || !fp.byte('[') {
				return false
			}
			body.Stats = make([]DatabaseStat, 0, len(fp.data)/80) // ~75 bytes a stat
			if fp.byte(']') {
				return true
			}
			for {
				var st DatabaseStat
				if !fp.object(func(key string, seen *uint32) bool {
					switch key {
					case "uuid":
						s, ok := fp.str()
						st.UUID = s
						return ok && once(seen, 1)
					case "size_bytes":
						v, ok := fp.int(19)
						st.SizeBytes = v
						return ok && once(seen, 2)
					case "seq":
						v, ok := fp.int(19)
						st.Seq = v
						return ok && once(seen, 4)
					}
					return false
				}) {
					return false
				}
				body.Stats = append(body.Stats, st)
				if fp.byte(']') {
					return true
				}
				if !fp.byte(',') {
					return false
				}
			}
		})
	})
	if !ok || cmd.Type != CmdSetDatabaseStats {
		return Command{}, SetDatabaseStats{}, false
	}
	return cmd, body, true
}

// plainJSONString reports whether json.Marshal writes s as '"' + s + '"':
// printable ASCII with nothing it escapes (quote, backslash, and the HTML
// characters < > &).
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// encodeDatabase is json.Marshal(d) byte for byte (it becomes part of the
// stored dedupe record), without reflection when every string is plain;
// otherwise it is json.Marshal. TestEncodeDatabaseMatchesJSON checks both.
func encodeDatabase(d Database) ([]byte, error) {
	strs := [...]string{d.UUID, d.AccountID, d.Name, d.ObjectID, d.HostID, d.HostAddress,
		d.Region, d.Jurisdiction, d.ReadReplication, d.State}
	n := 200
	for _, s := range strs {
		if !plainJSONString(s) {
			return json.Marshal(d)
		}
		n += len(s)
	}
	b := make([]byte, 0, n)
	str := func(key, v string) {
		b = append(b, key...)
		b = append(b, '"')
		b = append(b, v...)
		b = append(b, '"')
	}
	str(`{"uuid":`, d.UUID)
	str(`,"account_id":`, d.AccountID)
	str(`,"name":`, d.Name)
	str(`,"object_id":`, d.ObjectID)
	str(`,"host_id":`, d.HostID)
	str(`,"host_address":`, d.HostAddress)
	str(`,"region":`, d.Region)
	str(`,"jurisdiction":`, d.Jurisdiction)
	str(`,"read_replication":`, d.ReadReplication)
	str(`,"state":`, d.State)
	b = append(b, `,"created_at":`...)
	b = strconv.AppendInt(b, d.CreatedAt, 10)
	if d.DeletedAt != 0 {
		b = append(b, `,"deleted_at":`...)
		b = strconv.AppendInt(b, d.DeletedAt, 10)
	}
	b = append(b, `,"routing_generation":`...)
	b = strconv.AppendInt(b, d.RoutingGeneration, 10)
	b = append(b, `,"size_bytes":`...)
	b = strconv.AppendInt(b, d.SizeBytes, 10)
	return append(b, '}'), nil
}
