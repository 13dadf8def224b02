package server

import (
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// Conversions between the records (internal/shard) and the API's
// messages live here, in one place, and so does the replay of the store's
// snapshots and changes as the coordinator's events.

func keyspaceProto(k shard.Keyspace) *v1.Keyspace {
	mode := v1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE
	if k.Mode == shard.ModeStream {
		mode = v1.KeyspaceMode_KEYSPACE_MODE_STREAM
	}
	return &v1.Keyspace{
		Name:         k.Name,
		Buckets:      uint32(k.Buckets),
		Hash:         string(k.Hash),
		Mode:         mode,
		LeaseTtl:     durationpb.New(k.LeaseTTL),
		DrainTimeout: durationpb.New(k.DrainTimeout),
	}
}

// keyspaceConfig reads an API keyspace into a config to validate.
func keyspaceConfig(k *v1.Keyspace) (KeyspaceConfig, error) {
	if k == nil {
		return KeyspaceConfig{}, invalid("keyspace: missing")
	}
	c := KeyspaceConfig{Name: k.GetName(), Buckets: int(k.GetBuckets()), Hash: placementHash(k.GetHash())}
	switch k.GetMode() {
	case v1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED, v1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE:
		c.Mode = "exclusive"
	case v1.KeyspaceMode_KEYSPACE_MODE_STREAM:
		c.Mode = "stream"
	default:
		return c, invalid("keyspace.mode: %d is unknown", k.GetMode())
	}
	for _, d := range []struct {
		field string
		in    *durationpb.Duration
		out   *time.Duration
	}{{"keyspace.lease_ttl", k.GetLeaseTtl(), &c.LeaseTTL}, {"keyspace.drain_timeout", k.GetDrainTimeout(), &c.DrainTimeout}} {
		if d.in == nil {
			continue
		}
		if err := d.in.CheckValid(); err != nil {
			return c, invalid("%s: %v", d.field, err)
		}
		*d.out = d.in.AsDuration()
	}
	if err := c.Normalize(); err != nil {
		return c, invalid("keyspace.%v", err)
	}
	return c, nil
}

func (c KeyspaceConfig) store() shard.Keyspace {
	return shard.Keyspace{Name: c.Name, Buckets: c.Buckets, Hash: c.Hash, Mode: shard.Mode(c.Mode), LeaseTTL: c.LeaseTTL, DrainTimeout: c.DrainTimeout}
}

func memberProto(m shard.Member) *v1.Member {
	return &v1.Member{Id: m.ID, Address: m.Address, Weight: m.Weight, Zone: m.Zone, Metadata: m.Metadata}
}

// snapshotEvents replays a snapshot as coordinator events, preceded by a
// Reset.
func snapshotEvents(s *store.Snapshot) []coordinator.Event {
	evs := []coordinator.Event{coordinator.Reset{}}
	for name, ks := range s.Keyspaces {
		if ks.Config.Exists() {
			evs = append(evs, coordinator.KeyspacePut{Keyspace: ks.Config.Value})
		}
		for _, m := range ks.Members {
			evs = append(evs, coordinator.MemberPut{Keyspace: name, Member: m.Value})
		}
		for id, d := range ks.Drains {
			evs = append(evs, coordinator.DrainPut{Keyspace: name, ID: id, Drain: d.Value, Session: d.Lease})
		}
		if ks.Map.Exists() {
			evs = append(evs, coordinator.MapPut{Keyspace: name, Map: ks.Map.Value, Rev: ks.Map.ModRevision})
		}
		for id, g := range ks.Grants {
			evs = append(evs, coordinator.GrantsPut{Keyspace: name, ID: id, Grants: g.Value, Rev: g.ModRevision})
		}
		for id, r := range ks.Releases {
			evs = append(evs, coordinator.ReleasesPut{Keyspace: name, ID: id, Releases: r.Value, Rev: r.ModRevision})
		}
		if ks.Tokens.Exists() {
			evs = append(evs, coordinator.TokensPut{Keyspace: name, Token: ks.Tokens.Value, Rev: ks.Tokens.ModRevision})
		}
		for id, q := range ks.Quarantines {
			evs = append(evs, coordinator.QuarantinePut{Keyspace: name, ID: id, Quarantine: q.Value})
		}
		for id, c := range ks.Commits {
			evs = append(evs, coordinator.CommitPut{Keyspace: name, ID: id, Commit: c.Value, Rev: c.ModRevision})
		}
		for chunk, p := range ks.BucketPos {
			evs = append(evs, coordinator.BucketPosPut{Keyspace: name, Chunk: chunk, Positions: p.Value, Rev: p.ModRevision})
		}
		for id, h := range ks.Held {
			evs = append(evs, coordinator.HeldPut{Keyspace: name, ID: id, Held: h.Value, Rev: h.ModRevision})
		}
		if ks.Reserved.Exists() {
			evs = append(evs, coordinator.ReservationPut{Keyspace: name, Reservation: ks.Reserved.Value, Rev: ks.Reserved.ModRevision})
		}
	}
	return evs
}

// changeEvent turns one watched change into a coordinator event, or nil
// for keys the coordinator does not follow.
func changeEvent(c store.Change) coordinator.Event {
	if c.Err != nil {
		return nil // a corrupt value: the view reports it; the machine keeps what it had
	}
	switch c.Kind {
	case store.KindKeyspace:
		if c.Deleted {
			return coordinator.KeyspaceDeleted{Name: c.Keyspace}
		}
		return coordinator.KeyspacePut{Keyspace: c.Value.(shard.Keyspace)}
	case store.KindMember:
		if c.Deleted {
			return coordinator.MemberDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.MemberPut{Keyspace: c.Keyspace, Member: c.Value.(shard.Member)}
	case store.KindDrain:
		if c.Deleted {
			return coordinator.DrainDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.DrainPut{Keyspace: c.Keyspace, ID: c.ID, Drain: c.Value.(shard.Drain), Session: c.Lease}
	case store.KindMap:
		if c.Deleted {
			return nil
		}
		return coordinator.MapPut{Keyspace: c.Keyspace, Map: c.Value.(shard.Map), Rev: c.ModRevision}
	case store.KindGrants:
		if c.Deleted {
			return coordinator.GrantsDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.GrantsPut{Keyspace: c.Keyspace, ID: c.ID, Grants: c.Value.(shard.Grants), Rev: c.ModRevision}
	case store.KindReleases:
		if c.Deleted {
			return coordinator.ReleasesDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.ReleasesPut{Keyspace: c.Keyspace, ID: c.ID, Releases: c.Value.(shard.Releases), Rev: c.ModRevision}
	case store.KindTokens:
		if c.Deleted {
			return nil
		}
		return coordinator.TokensPut{Keyspace: c.Keyspace, Token: c.Value.(uint64), Rev: c.ModRevision}
	case store.KindQuarantine:
		if c.Deleted {
			return coordinator.QuarantineDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.QuarantinePut{Keyspace: c.Keyspace, ID: c.ID, Quarantine: c.Value.(shard.Quarantine)}
	case store.KindPositions:
		if c.Deleted {
			return coordinator.CommitDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.CommitPut{Keyspace: c.Keyspace, ID: c.ID, Commit: c.Value.(shard.Commit), Rev: c.ModRevision}
	case store.KindHeld:
		if c.Deleted {
			return coordinator.HeldDeleted{Keyspace: c.Keyspace, ID: c.ID}
		}
		return coordinator.HeldPut{Keyspace: c.Keyspace, ID: c.ID, Held: c.Value.(shard.Held), Rev: c.ModRevision}
	case store.KindReserved:
		if c.Deleted {
			return coordinator.ReservationDeleted{Keyspace: c.Keyspace}
		}
		return coordinator.ReservationPut{Keyspace: c.Keyspace, Reservation: c.Value.(shard.Reservation), Rev: c.ModRevision}
	case store.KindBucketPos:
		chunk, err := strconv.Atoi(c.ID) // store.ParseKey checked it
		if err != nil {
			return nil
		}
		if c.Deleted {
			return coordinator.BucketPosDeleted{Keyspace: c.Keyspace, Chunk: chunk}
		}
		return coordinator.BucketPosPut{Keyspace: c.Keyspace, Chunk: chunk, Positions: c.Value.(shard.BucketPositions), Rev: c.ModRevision}
	}
	return nil
}

// hotPoolConfig reads an API hot-key pool into a config, with defaults
// filled in, or an INVALID_ARGUMENT error naming the field ("pool.threshold").
func hotPoolConfig(p *v1.HotKeyPool) (HotKeyPoolConfig, error) {
	if p == nil {
		return HotKeyPoolConfig{}, invalid("pool: missing; send {\"pool\": {\"name\": ..., \"threshold\": ...}}")
	}
	c := HotKeyPoolConfig{Name: p.GetName(), Threshold: p.GetThreshold(), LowThreshold: p.GetLowThreshold(), ReportThreshold: p.GetReportThreshold(), MaxKeys: int(p.GetMaxKeys())}
	for _, d := range []struct {
		field string
		in    *durationpb.Duration
		out   *time.Duration
	}{{"pool.cooldown", p.GetCooldown(), &c.Cooldown}, {"pool.report_max_age", p.GetReportMaxAge(), &c.ReportMaxAge}} {
		if d.in == nil {
			continue
		}
		if err := d.in.CheckValid(); err != nil {
			return c, invalid("%s: %v", d.field, err)
		}
		*d.out = d.in.AsDuration()
	}
	if err := c.Normalize(); err != nil {
		return c, invalid("pool.%v", err)
	}
	return c, nil
}

func (c HotKeyPoolConfig) store() store.HotPool {
	return store.HotPool{Name: c.Name, Threshold: c.Threshold, LowThreshold: c.LowThreshold, Cooldown: c.Cooldown, ReportThreshold: c.ReportThreshold, ReportMaxAge: c.ReportMaxAge, MaxKeys: c.MaxKeys}
}

func hotPoolProto(p store.HotPool) *v1.HotKeyPool {
	return &v1.HotKeyPool{
		Name:            p.Name,
		Threshold:       p.Threshold,
		LowThreshold:    p.LowThreshold,
		Cooldown:        durationpb.New(p.Cooldown),
		ReportThreshold: p.ReportThreshold,
		ReportMaxAge:    durationpb.New(p.ReportMaxAge),
		MaxKeys:         uint32(p.MaxKeys),
	}
}

// aggregateConfig is a pool's settings as hotkey.Aggregate takes them.
func aggregateConfig(p store.HotPool) hotkey.AggregateConfig {
	return hotkey.AggregateConfig{Threshold: p.Threshold, LowThreshold: p.LowThreshold, Cooldown: p.Cooldown, MaxAge: p.ReportMaxAge, MaxKeys: p.MaxKeys}
}

func overflowProto(pool string, s hotkey.OverflowSet) *v1.OverflowSet {
	out := &v1.OverflowSet{Pool: pool, Version: s.Version, Keys: make([]*v1.OverflowKey, len(s.Entries))}
	for i, e := range s.Entries {
		k := &v1.OverflowKey{Key: e.Key, Rate: e.Rate, Since: timestamppb.New(e.Since)}
		if !e.BelowSince.IsZero() {
			k.CoolingSince = timestamppb.New(e.BelowSince)
		}
		out.Keys[i] = k
	}
	return out
}
