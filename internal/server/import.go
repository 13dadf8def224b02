package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// The wait for imported instances: DefaultImportWait when the request
// sets none, at most MaxImportWait.
const (
	DefaultImportWait = 10 * time.Minute
	MaxImportWait     = 24 * time.Hour
)

// importBuckets is the bucket count an import over n instances gets when
// the request sets none: the multiple of n nearest placement's default
// (4096), at least n. With 4 instances that is 4096, with 3 it is 4095,
// with 6 it is 4098.
func importBuckets(n int) int {
	if n <= 0 {
		return placement.DefaultBuckets
	}
	per := (placement.DefaultBuckets + n/2) / n
	return max(per, 1) * n
}

// importPlan is a validated ImportKeyspace request.
type importPlan struct {
	imp       store.Import
	instances []string
	wait      time.Duration
}

// importRequest validates req and builds the import; errors are
// INVALID_ARGUMENT naming the field.
func importRequest(req *v1.ImportKeyspaceRequest, now time.Time) (importPlan, error) {
	in := req.GetKeyspace()
	if in == nil {
		return importPlan{}, invalid("keyspace: missing; send {\"keyspace\": {\"name\": ...}, \"instances\": [...]}")
	}
	switch h := in.GetHash(); h {
	case "", string(placement.HashSynapse):
	default:
		return importPlan{}, invalid("keyspace.hash: %q; an import reproduces sha256(key) mod N, so the hash is %q (or leave it empty)", h, placement.HashSynapse)
	}
	insts := req.GetInstances()
	if len(insts) == 0 {
		return importPlan{}, invalid("instances: empty; name the instances in the order of the static mapping")
	}
	if len(insts) > store.MaxMapMembers {
		return importPlan{}, invalid("instances: %d instances; at most %d", len(insts), store.MaxMapMembers)
	}
	p := importPlan{instances: make([]string, len(insts))}
	seen := make(map[string]int, len(insts))
	for i, inst := range insts {
		id := inst.GetMember()
		if err := store.ValidateName(store.KindMember, id); err != nil {
			return importPlan{}, invalid("instances[%d].member: %v", i, strings.TrimPrefix(err.Error(), store.ErrInvalidName.Error()+": "))
		}
		if j, ok := seen[id]; ok {
			return importPlan{}, invalid("instances[%d].member: %q is also instances[%d]; name each instance once", i, id, j)
		}
		seen[id] = i
		p.instances[i] = id
	}
	k := &v1.Keyspace{
		Name: in.GetName(), Buckets: in.GetBuckets(), Hash: string(placement.HashSynapse), Mode: in.GetMode(),
		LeaseTtl: in.GetLeaseTtl(), DrainTimeout: in.GetDrainTimeout(),
	}
	if k.Buckets == 0 {
		k.Buckets = uint32(importBuckets(len(insts)))
	}
	c, err := keyspaceConfig(k)
	if err != nil {
		return importPlan{}, err
	}
	a, err := placement.SynapseAssignment(c.Buckets, p.instances)
	if err != nil {
		return importPlan{}, invalid("keyspace.buckets: %s", strings.TrimPrefix(err.Error(), placement.ErrInvalid.Error()+": "))
	}
	stream := c.Mode == "stream"
	if !stream {
		for i, inst := range insts {
			if inst.GetPosition() != 0 {
				return importPlan{}, invalid("instances[%d].position: %d, but keyspace.mode is %s; positions are for stream keyspaces (KEYSPACE_MODE_STREAM)", i, inst.GetPosition(), c.Mode)
			}
		}
	}
	p.wait = DefaultImportWait
	if w := req.GetWaitForInstances(); w != nil {
		if err := w.CheckValid(); err != nil {
			return importPlan{}, invalid("wait_for_instances: %v", err)
		}
		switch d := w.AsDuration(); {
		case d < 0 || d > MaxImportWait:
			return importPlan{}, invalid("wait_for_instances: %v is out of range; want up to %v (0 means %v)", d, MaxImportWait, DefaultImportWait)
		case d > 0:
			p.wait = d
		}
	}
	p.imp = store.Import{
		Keyspace: c.store(),
		Map:      shard.Map{Epoch: 1, Hash: c.Hash, Assignment: a},
		Reserved: shard.Reservation{Members: p.instances, Until: now.Add(p.wait)},
	}
	if stream {
		dense := make([]uint64, c.Buckets)
		for b := range dense {
			dense[b] = insts[b%len(insts)].GetPosition()
		}
		p.imp.Positions = shard.NewBucketPositions(dense)
	}
	return p, nil
}

func (a *adminService) ImportKeyspace(ctx context.Context, req *connect.Request[v1.ImportKeyspaceRequest]) (*connect.Response[v1.ImportKeyspaceResponse], error) {
	p, err := importRequest(req.Msg, a.s.clock.Now())
	if err != nil {
		return nil, err
	}
	k := p.imp.Keyspace
	p.imp.History = &store.EpochChange{
		Epoch: p.imp.Map.Epoch, Time: a.s.clock.Now(), Reason: string(coordinator.ReasonImport),
		Members: slices.Sorted(maps.Keys(p.imp.Map.Assignment.Counts())), Moved: k.Buckets,
		Detail: fmt.Sprintf("imported a static mapping of %d buckets over %d instances", k.Buckets, len(p.instances)),
	}
	p.imp.History.Moves = importMoves(p.imp.Map)
	rev, err := a.s.store.ImportKeyspace(ctx, p.imp)
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, connect.NewError(connect.CodeAlreadyExists, errorf("keyspace %q already exists; an import creates a new keyspace: import under another name", k.Name))
		}
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	per := uint32(k.Buckets / len(p.instances))
	resp := &v1.ImportKeyspaceResponse{Keyspace: keyspaceProto(k), Epoch: p.imp.Map.Epoch, Buckets: make([]uint32, len(p.instances))}
	for i := range resp.Buckets {
		resp.Buckets[i] = per
	}
	a.s.log.Info("imported keyspace", "keyspace", k.Name, "buckets", k.Buckets, "mode", k.Mode, "instances", len(p.instances),
		"buckets_per_instance", per, "wait_for_instances", p.wait.String(), "until", p.imp.Reserved.Until.UTC().Format(time.RFC3339))
	return connect.NewResponse(resp), nil
}

// importMoves are the moves of an import's first map: every bucket from
// no owner to its instance.
func importMoves(m shard.Map) []store.HistoryMove {
	var out []store.HistoryMove
	counts := m.Assignment.Counts()
	for _, id := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, store.HistoryMove{To: id, Buckets: counts[id]})
	}
	return out
}
