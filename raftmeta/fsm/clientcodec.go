package fsm

import "strconv"

// The catalog client's side of the hottest command (raftmeta.Client's
// CreateDatabasesAs, the edge's batches of creates): encoding each
// create_database command and decoding each created Database were, with
// encoding/json, ~5% of an edge's CPU in a create phase (the command
// encoded twice — its body, then the envelope re-validating and
// re-compacting the body — and each answer decoded by reflection). Both
// functions here produce or accept exactly what encoding/json does, and
// decline (ok=false: use encoding/json) anything else.

// EncodeCreateDatabaseCommand returns json.Marshal of the create_database
// command NewCommand(CmdCreateDatabase, requestID, unixNano, body) with
// Audit set to audit, byte for byte, without reflection. ok=false when a
// string needs escaping (then use NewCommand and json.Marshal).
// TestEncodeCreateDatabaseCommandMatchesJSON checks it.
func EncodeCreateDatabaseCommand(requestID string, unixNano int64, body CreateDatabase, audit *Audit) ([]byte, bool) {
	strs := [...]string{requestID, body.UUID, body.AccountID, body.Name, body.ObjectID, body.HostID,
		body.Region, body.Jurisdiction, body.ReadReplication}
	n := 240
	for _, s := range strs {
		if !plainJSONString(s) {
			return nil, false
		}
		n += len(s)
	}
	if audit != nil {
		if !plainJSONString(audit.Actor) || !plainJSONString(audit.Source) {
			return nil, false
		}
		n += len(audit.Actor) + len(audit.Source)
	}
	b := make([]byte, 0, n)
	str := func(key, v string) {
		b = append(b, key...)
		b = append(b, '"')
		b = append(b, v...)
		b = append(b, '"')
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, CommandVersion, 10)
	str(`,"type":`, string(CmdCreateDatabase))
	str(`,"rid":`, requestID)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, unixNano, 10)
	str(`,"body":{"uuid":`, body.UUID)
	str(`,"account_id":`, body.AccountID)
	str(`,"name":`, body.Name)
	str(`,"object_id":`, body.ObjectID)
	str(`,"host_id":`, body.HostID)
	str(`,"region":`, body.Region)
	str(`,"jurisdiction":`, body.Jurisdiction)
	str(`,"read_replication":`, body.ReadReplication)
	b = append(b, '}')
	if audit != nil {
		str(`,"audit":{"actor":`, audit.Actor)
		if audit.Source != "" {
			str(`,"source":`, audit.Source)
		}
		b = append(b, '}')
	}
	return append(b, '}'), true
}

// DecodeDatabase decodes a Database in the canonical form the FSM writes
// (encodeDatabase: no whitespace, keys exactly as tagged, plain ASCII
// strings) in one pass. ok=false means "use encoding/json" (never
// "invalid"); on what it accepts it yields exactly what json.Unmarshal
// into a zero Database yields (TestDecodeDatabaseMatchesJSON,
// FuzzDecodeDatabase).
func DecodeDatabase(data []byte) (d Database, ok bool) {
	fp := &fastParser{data: data}
	ok = fp.object(func(key string, seen *uint32) bool {
		var dst *string
		var num *int64
		var bit uint32
		switch key {
		case "uuid":
			dst, bit = &d.UUID, 1
		case "account_id":
			dst, bit = &d.AccountID, 2
		case "name":
			dst, bit = &d.Name, 4
		case "object_id":
			dst, bit = &d.ObjectID, 8
		case "host_id":
			dst, bit = &d.HostID, 16
		case "host_address":
			dst, bit = &d.HostAddress, 32
		case "region":
			dst, bit = &d.Region, 64
		case "jurisdiction":
			dst, bit = &d.Jurisdiction, 128
		case "read_replication":
			dst, bit = &d.ReadReplication, 256
		case "state":
			dst, bit = &d.State, 512
		case "created_at":
			num, bit = &d.CreatedAt, 1024
		case "deleted_at":
			num, bit = &d.DeletedAt, 2048
		case "routing_generation":
			num, bit = &d.RoutingGeneration, 4096
		case "size_bytes":
			num, bit = &d.SizeBytes, 8192
		default:
			return false
		}
		if num != nil {
			v, ok := fp.int(19)
			*num = v
			return ok && once(seen, bit)
		}
		s, ok := fp.str()
		*dst = s
		return ok && once(seen, bit)
	})
	if !ok || fp.p != len(data) {
		return Database{}, false
	}
	return d, true
}
