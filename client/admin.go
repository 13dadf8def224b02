package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
)

// Admin is the admin API of a Client: keyspaces, members, drains,
// status and hot-key pools. It needs a token with the admin role. Errors wrap the package's
// sentinels (ErrInvalid, ErrNotFound, ErrExists, ErrImmutable,
// ErrUnavailable, ErrUnauthenticated, ErrPermissionDenied, ErrClosed).
type Admin struct{ c *Client }

// drainPoll is how long WaitDrained waits for a new map between two reads
// of the member list.
const drainPoll = time.Second

// CreateKeyspace creates a keyspace and returns it with the server's
// defaults filled in. It returns an error wrapping ErrExists if the name
// is taken, or ErrInvalid for a bad config.
func (a *Admin) CreateKeyspace(ctx context.Context, cfg KeyspaceConfig) (KeyspaceConfig, error) {
	k, err := keyspaceToProto("Admin.CreateKeyspace", cfg)
	if err != nil {
		return KeyspaceConfig{}, err
	}
	resp, err := call(ctx, a.c, adminAPI.CreateKeyspace, &keyshardv1.CreateKeyspaceRequest{Keyspace: k})
	if err != nil {
		return KeyspaceConfig{}, fmt.Errorf("create keyspace %q: %w", cfg.Name, err)
	}
	return keyspaceFromProto(resp.GetKeyspace()), nil
}

// GetKeyspace returns keyspace name, or an error wrapping ErrNotFound.
func (a *Admin) GetKeyspace(ctx context.Context, name string) (KeyspaceConfig, error) {
	if err := validName("Admin.GetKeyspace", "keyspace name", name); err != nil {
		return KeyspaceConfig{}, err
	}
	resp, err := call(ctx, a.c, adminAPI.GetKeyspace, &keyshardv1.GetKeyspaceRequest{Name: name})
	if err != nil {
		return KeyspaceConfig{}, fmt.Errorf("get keyspace %q: %w", name, err)
	}
	return keyspaceFromProto(resp.GetKeyspace()), nil
}

// ListKeyspaces returns every keyspace.
func (a *Admin) ListKeyspaces(ctx context.Context) ([]KeyspaceConfig, error) {
	resp, err := call(ctx, a.c, adminAPI.ListKeyspaces, &keyshardv1.ListKeyspacesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list keyspaces: %w", err)
	}
	out := make([]KeyspaceConfig, 0, len(resp.GetKeyspaces()))
	for _, k := range resp.GetKeyspaces() {
		out = append(out, keyspaceFromProto(k))
	}
	return out, nil
}

// UpdateKeyspace changes a keyspace's LeaseTTL and DrainTimeout and
// returns the result. Zero fields are left unchanged. It returns an error
// wrapping ErrImmutable if cfg sets Buckets, Hash or Mode to something
// other than their current values, which never change.
func (a *Admin) UpdateKeyspace(ctx context.Context, cfg KeyspaceConfig) (KeyspaceConfig, error) {
	k, err := keyspaceToProto("Admin.UpdateKeyspace", cfg)
	if err != nil {
		return KeyspaceConfig{}, err
	}
	resp, err := call(ctx, a.c, adminAPI.UpdateKeyspace, &keyshardv1.UpdateKeyspaceRequest{Keyspace: k})
	if err != nil {
		return KeyspaceConfig{}, fmt.Errorf("update keyspace %q: %w", cfg.Name, err)
	}
	return keyspaceFromProto(resp.GetKeyspace()), nil
}

// ListMembersOption changes what Admin.ListMembers reads.
type ListMembersOption interface {
	applyListMembers(*keyshardv1.ListMembersRequest)
}

type listMembersFunc func(*keyshardv1.ListMembersRequest)

func (f listMembersFunc) applyListMembers(r *keyshardv1.ListMembersRequest) { f(r) }

// WithLeaseLeft makes ListMembers also read each member's lease time left
// (MemberStatus.LeaseLeft) from etcd: one read per member, so leave it off
// where the list is read often for many members.
func WithLeaseLeft() ListMembersOption {
	return listMembersFunc(func(r *keyshardv1.ListMembersRequest) { r.LeaseLeft = true })
}

// ListMembers returns the members of keyspace with their bucket counts
// (and their lease time left, with WithLeaseLeft).
func (a *Admin) ListMembers(ctx context.Context, keyspace string, opts ...ListMembersOption) (Members, error) {
	if err := validName("Admin.ListMembers", "keyspace name", keyspace); err != nil {
		return Members{}, err
	}
	req := &keyshardv1.ListMembersRequest{Keyspace: keyspace}
	for _, o := range opts {
		o.applyListMembers(req)
	}
	resp, err := call(ctx, a.c, adminAPI.ListMembers, req)
	if err != nil {
		return Members{}, fmt.Errorf("list members of keyspace %q: %w", keyspace, err)
	}
	out := Members{Epoch: resp.GetEpoch(), Members: make([]MemberStatus, 0, len(resp.GetMembers()))}
	for _, m := range resp.GetMembers() {
		out.Members = append(out.Members, memberStatusFromProto(m))
	}
	return out, nil
}

// DrainMember asks the control plane to move every bucket away from
// member. The member stays joined, holding nothing, until it leaves. Use
// WaitDrained to wait for the moves to finish.
func (a *Admin) DrainMember(ctx context.Context, keyspace, member string) error {
	if err := validName("Admin.DrainMember", "keyspace name", keyspace); err != nil {
		return err
	}
	if err := validName("Admin.DrainMember", "member id", member); err != nil {
		return err
	}
	if _, err := call(ctx, a.c, adminAPI.DrainMember, &keyshardv1.DrainMemberRequest{Keyspace: keyspace, Member: member}); err != nil {
		return fmt.Errorf("drain member %q of keyspace %q: %w", member, keyspace, err)
	}
	return nil
}

// WaitDrained blocks until member of keyspace is neither the target of
// any bucket nor holds any (or has left), calling progress, if not nil,
// with the number of buckets it still has after every read of the member
// list. It reads the member list (ListMembers) each time the map changes
// (a GetMap long poll) and at least every second. It returns nil when the
// member is drained, or ctx.Err(), or the error of a failed call.
//
// The number passed to progress is max(target, granted): it falls to 0 as
// the member releases its buckets.
func (a *Admin) WaitDrained(ctx context.Context, keyspace, member string, progress func(left int)) error {
	if err := validName("Admin.WaitDrained", "keyspace name", keyspace); err != nil {
		return err
	}
	if err := validName("Admin.WaitDrained", "member id", member); err != nil {
		return err
	}
	for {
		list, err := a.ListMembers(ctx, keyspace)
		if err != nil {
			return err
		}
		left := 0
		for _, m := range list.Members {
			if m.ID == member {
				left = max(m.TargetBuckets, m.GrantedBuckets)
			}
		}
		if progress != nil {
			progress(left)
		}
		if left == 0 {
			return nil
		}
		start := a.c.opts.clock.Now()
		req := &keyshardv1.GetMapRequest{Keyspace: keyspace, SinceEpoch: list.Epoch, Wait: durationpb.New(drainPoll)}
		resp, err := callWithin(ctx, a.c, mapAPI.GetMap, req, budget{wait: drainPoll})
		if err != nil {
			return fmt.Errorf("wait for member %q of keyspace %q to drain: %w", member, keyspace, err)
		}
		if elapsed := a.c.opts.clock.Since(start); !resp.GetChanged() && elapsed < drainPoll/2 {
			// The server answered at once without a new map: pace the reads.
			if !clock.Sleep(ctx, a.c.opts.clock, drainPoll-elapsed) {
				return ctx.Err()
			}
		}
	}
}

// Status returns the state of the control plane and of every keyspace.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	resp, err := call(ctx, a.c, adminAPI.Status, &keyshardv1.StatusRequest{})
	if err != nil {
		return Status{}, fmt.Errorf("status: %w", err)
	}
	return statusFromProto(resp), nil
}

// PutHotKeyPool creates a hot-key pool or replaces its settings, and
// returns it as stored, with the server's defaults filled in. A new
// threshold applies from the leader's next aggregation. It returns an
// error wrapping ErrInvalid for a bad pool.
func (a *Admin) PutHotKeyPool(ctx context.Context, pool HotKeyPool) (HotKeyPool, error) {
	p, err := hotKeyPoolToProto("Admin.PutHotKeyPool", pool)
	if err != nil {
		return HotKeyPool{}, err
	}
	resp, err := call(ctx, a.c, adminAPI.PutHotKeyPool, &keyshardv1.PutHotKeyPoolRequest{Pool: p})
	if err != nil {
		return HotKeyPool{}, fmt.Errorf("put hot-key pool %q: %w", pool.Name, err)
	}
	return hotKeyPoolFromProto(resp.GetPool()), nil
}

// ListHotKeyPools returns every hot-key pool.
func (a *Admin) ListHotKeyPools(ctx context.Context) ([]HotKeyPool, error) {
	resp, err := call(ctx, a.c, adminAPI.ListHotKeyPools, &keyshardv1.ListHotKeyPoolsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list hot-key pools: %w", err)
	}
	out := make([]HotKeyPool, 0, len(resp.GetPools()))
	for _, p := range resp.GetPools() {
		out = append(out, hotKeyPoolFromProto(p))
	}
	return out, nil
}

// MaxPositionsBehind is the most buckets Admin.Positions lists as
// furthest behind.
const MaxPositionsBehind = 1000

// Positions returns the committed positions of stream keyspace keyspace:
// the minimum, maximum and spread over every bucket, every bucket's
// position in runs, and the behind buckets furthest behind with their
// holders (0 means 10; at most MaxPositionsBehind). It returns an error
// wrapping ErrNotFound for an unknown keyspace, ErrInvalid for one that is
// not a stream keyspace or a bad behind.
func (a *Admin) Positions(ctx context.Context, keyspace string, behind int) (Positions, error) {
	if err := validName("Admin.Positions", "keyspace name", keyspace); err != nil {
		return Positions{}, err
	}
	if behind < 0 || behind > MaxPositionsBehind {
		return Positions{}, argError("Admin.Positions", "behind", "%d is outside [0, %d]", behind, MaxPositionsBehind)
	}
	resp, err := call(ctx, a.c, adminAPI.GetPositions, &keyshardv1.GetPositionsRequest{Keyspace: keyspace, Behind: uint32(behind)})
	if err != nil {
		return Positions{}, fmt.Errorf("get positions of keyspace %q: %w", keyspace, err)
	}
	return positionsFromProto(resp), nil
}

// ResetPositions sets the committed position of buckets of stream
// keyspace keyspace to position, also backwards (disaster recovery: a
// stream restored from a backup). The buckets must be held by nobody:
// drain or stop their holders first. If one is held, nothing is reset and
// the error (wrapping ErrImmutable: the server answers
// FailedPrecondition) names the bucket and its holder. Buckets must be in
// the keyspace's range and listed once (ErrInvalid).
func (a *Admin) ResetPositions(ctx context.Context, keyspace string, buckets []int, position uint64) (PositionsReset, error) {
	if err := validName("Admin.ResetPositions", "keyspace name", keyspace); err != nil {
		return PositionsReset{}, err
	}
	if len(buckets) == 0 {
		return PositionsReset{}, argError("Admin.ResetPositions", "buckets", "is empty; use ResetAllPositions to reset every bucket")
	}
	in := make([]uint32, len(buckets))
	for i, b := range buckets {
		if b < 0 || b >= 65536 {
			return PositionsReset{}, argError("Admin.ResetPositions", "buckets", "entry %d: %d is outside [0, 65536)", i, b)
		}
		in[i] = uint32(b)
	}
	return a.resetPositions(ctx, &keyshardv1.ResetPositionsRequest{Keyspace: keyspace, Buckets: in, Position: position})
}

// ResetAllPositions is ResetPositions for every bucket of the keyspace.
func (a *Admin) ResetAllPositions(ctx context.Context, keyspace string, position uint64) (PositionsReset, error) {
	if err := validName("Admin.ResetAllPositions", "keyspace name", keyspace); err != nil {
		return PositionsReset{}, err
	}
	return a.resetPositions(ctx, &keyshardv1.ResetPositionsRequest{Keyspace: keyspace, AllBuckets: true, Position: position})
}

func (a *Admin) resetPositions(ctx context.Context, req *keyshardv1.ResetPositionsRequest) (PositionsReset, error) {
	resp, err := call(ctx, a.c, adminAPI.ResetPositions, req)
	if err != nil {
		return PositionsReset{}, fmt.Errorf("reset positions of keyspace %q: %w", req.GetKeyspace(), err)
	}
	return PositionsReset{Buckets: int(resp.GetBuckets()), Revision: resp.GetRevision()}, nil
}

// ImportInstance is one instance of a static mapping: the member id it
// will join with and, in a stream keyspace, its position (the position of
// the next event it would read; for Synapse's federation_stream_position,
// its stream_id + 1). Position must be 0 in an exclusive keyspace.
type ImportInstance struct {
	Member   string
	Position uint64
}

// KeyspaceImport is what ImportKeyspace creates.
type KeyspaceImport struct {
	// Keyspace is the keyspace to create. Hash must be empty or
	// placement.HashSynapse. Buckets must be a multiple of the number of
	// instances; 0 means the multiple nearest 4096 (4096 for 4 instances,
	// 4095 for 3).
	Keyspace KeyspaceConfig
	// Instances are the instances in the order of the static mapping:
	// instance i owns the keys with sha256(key) mod N == i.
	Instances []ImportInstance
	// WaitForInstances is how long the buckets of an instance that has not
	// joined wait for it before they are placed over the members present:
	// 0 means 10 minutes; at most 24 hours.
	WaitForInstances time.Duration
}

// ImportedKeyspace is the result of ImportKeyspace.
type ImportedKeyspace struct {
	Keyspace KeyspaceConfig
	// Epoch is the first map's.
	Epoch uint64
	// Buckets is the number of buckets of each instance, in the order of
	// KeyspaceImport.Instances.
	Buckets []int
}

// ImportKeyspace creates a keyspace whose first map reproduces a static
// sha256(key) mod N mapping over imp.Instances exactly, so that nothing
// moves when those instances join under their member ids; in a stream
// keyspace each bucket starts at its instance's position. Until an
// instance joins, its buckets are granted to nobody, for at most
// imp.WaitForInstances. It returns an error wrapping ErrExists if the
// keyspace exists, or ErrInvalid naming the field (keyspace.buckets when
// the count is not a multiple of the instances, instances[i].member,
// instances[i].position, wait_for_instances).
func (a *Admin) ImportKeyspace(ctx context.Context, imp KeyspaceImport) (ImportedKeyspace, error) {
	const fn = "Admin.ImportKeyspace"
	k, err := keyspaceToProto(fn, imp.Keyspace)
	if err != nil {
		return ImportedKeyspace{}, err
	}
	if len(imp.Instances) == 0 {
		return ImportedKeyspace{}, argError(fn, "KeyspaceImport.Instances", "is empty; name the instances in the order of the static mapping")
	}
	if imp.WaitForInstances < 0 {
		return ImportedKeyspace{}, argError(fn, "KeyspaceImport.WaitForInstances", "%v is negative (0 means the default, 10m)", imp.WaitForInstances)
	}
	req := &keyshardv1.ImportKeyspaceRequest{Keyspace: k, WaitForInstances: durationToProto(imp.WaitForInstances)}
	for i, inst := range imp.Instances {
		if err := validName(fn, fmt.Sprintf("KeyspaceImport.Instances[%d].Member", i), inst.Member); err != nil {
			return ImportedKeyspace{}, err
		}
		req.Instances = append(req.Instances, &keyshardv1.ImportInstance{Member: inst.Member, Position: inst.Position})
	}
	resp, err := call(ctx, a.c, adminAPI.ImportKeyspace, req)
	if err != nil {
		return ImportedKeyspace{}, fmt.Errorf("import keyspace %q: %w", imp.Keyspace.Name, err)
	}
	out := ImportedKeyspace{Keyspace: keyspaceFromProto(resp.GetKeyspace()), Epoch: resp.GetEpoch(), Buckets: make([]int, len(resp.GetBuckets()))}
	for i, b := range resp.GetBuckets() {
		out.Buckets[i] = int(b)
	}
	return out, nil
}
