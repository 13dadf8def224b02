package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/hotkey"
)

// MoveReason says why a map epoch moved buckets, as the leader decided it
// (see Admin.History).
type MoveReason string

// The reasons of an epoch.
const (
	ReasonCreate MoveReason = "create" // the keyspace's first map
	ReasonJoin   MoveReason = "join"   // buckets moved to members that owned nothing
	ReasonLeave  MoveReason = "leave"  // away from members that asked to leave
	ReasonCrash  MoveReason = "crash"  // away from members whose session ended without a Leave
	ReasonDrain  MoveReason = "drain"  // away from drained members
	ReasonLoad   MoveReason = "load"   // weights or zones changed, no member came or went
	ReasonUpdate MoveReason = "update" // the keyspace's settings changed
	ReasonImport MoveReason = "import" // an imported map
)

// EpochChange is one epoch of a keyspace's map: why it moved buckets and
// where to.
type EpochChange struct {
	Epoch  uint64
	Time   time.Time // by the leader's clock
	Reason MoveReason
	// Members are those whose event it was (joined, left, crashed,
	// drained); empty for create, load and update.
	Members      []string
	MovedBuckets int
	// Moves are the moved buckets per (from, to) pair, most first; ""
	// is unassigned.
	Moves []Move
	// Detail is a sentence for people; it says when the reason is a best
	// guess (several events folded into one epoch).
	Detail string
}

// Move is a number of buckets whose target owner went From → To.
type Move struct {
	From, To string
	Buckets  int
}

// MaxHistory is the most epochs Admin.History returns; the leader keeps
// that many per keyspace.
const MaxHistory = 500

// History returns the latest limit epochs of keyspace's map, newest first
// (0 means 50; at most MaxHistory). Any replica answers, with a member
// token too. It returns an error wrapping ErrNotFound for an unknown
// keyspace, ErrInvalid for a bad limit.
func (a *Admin) History(ctx context.Context, keyspace string, limit int) ([]EpochChange, error) {
	if limit < 0 || limit > MaxHistory {
		return nil, fmt.Errorf("%w: history of %q: limit %d; want 0..%d", ErrInvalid, keyspace, limit, MaxHistory)
	}
	resp, err := call(ctx, a.c, adminAPI.GetKeyspaceHistory, &keyshardv1.GetKeyspaceHistoryRequest{Keyspace: keyspace, Limit: uint32(limit)})
	if err != nil {
		return nil, fmt.Errorf("history of keyspace %q: %w", keyspace, err)
	}
	out := make([]EpochChange, 0, len(resp.GetChanges()))
	for _, c := range resp.GetChanges() {
		ch := EpochChange{
			Epoch: c.GetEpoch(), Time: timeFromProto(c.GetTime()),
			Reason:  MoveReason(strings.ToLower(strings.TrimPrefix(c.GetReason().String(), "MOVE_REASON_"))),
			Members: c.GetMembers(), MovedBuckets: int(c.GetMovedBuckets()), Detail: c.GetDetail(),
		}
		for _, m := range c.GetMoves() {
			ch.Moves = append(ch.Moves, Move{From: m.GetFrom(), To: m.GetTo(), Buckets: int(m.GetBuckets())})
		}
		out = append(out, ch)
	}
	return out, nil
}

// BucketState is where a bucket is between its map and its grant.
type BucketState string

// The states of a bucket.
const (
	BucketUnassigned    BucketState = "unassigned"     // no owner in the map
	BucketGranted       BucketState = "granted"        // held by its owner
	BucketReleasing     BucketState = "releasing"      // held by a member that is not its owner: a release awaited
	BucketAwaitingGrant BucketState = "awaiting-grant" // an owner, nobody holds it yet
)

// Buckets is every bucket of a keyspace (Admin.Buckets): its owner by
// the map, its holder and token by the grants, its state and (stream
// keyspaces) committed position, in runs of alike buckets.
type Buckets struct {
	Epoch   uint64
	Buckets int
	Stream  bool
	// Runs are in bucket order and cover 0..Buckets-1 exactly once.
	Runs []BucketRun
}

// BucketRun is Count buckets from First on, alike.
type BucketRun struct {
	First, Count  int
	Owner, Holder string // "" none
	Token         uint64 // the holder's fencing token, 0 none
	State         BucketState
	Position      uint64 // stream keyspaces
}

// Buckets returns every bucket of keyspace in runs. Any replica answers,
// with a member token too. It returns an error wrapping ErrNotFound for an
// unknown keyspace.
func (a *Admin) Buckets(ctx context.Context, keyspace string) (Buckets, error) {
	resp, err := call(ctx, a.c, adminAPI.GetBuckets, &keyshardv1.GetBucketsRequest{Keyspace: keyspace})
	if err != nil {
		return Buckets{}, fmt.Errorf("buckets of keyspace %q: %w", keyspace, err)
	}
	ms := resp.GetMembers()
	member := func(i uint32) (string, error) {
		if i == 0 {
			return "", nil
		}
		if int(i) > len(ms) {
			return "", fmt.Errorf("buckets of keyspace %q: the answer names member %d of %d (a server bug)", keyspace, i, len(ms))
		}
		return ms[i-1], nil
	}
	out := Buckets{Epoch: resp.GetEpoch(), Buckets: int(resp.GetBuckets()), Stream: resp.GetStream(), Runs: make([]BucketRun, 0, len(resp.GetRuns()))}
	for _, r := range resp.GetRuns() {
		owner, err := member(r.GetOwner())
		if err != nil {
			return Buckets{}, err
		}
		holder, err := member(r.GetHolder())
		if err != nil {
			return Buckets{}, err
		}
		out.Runs = append(out.Runs, BucketRun{
			First: int(r.GetFirst()), Count: int(r.GetCount()), Owner: owner, Holder: holder, Token: r.GetToken(),
			State:    BucketState(strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(r.GetState().String(), "BUCKET_STATE_")), "_", "-")),
			Position: r.GetPosition(),
		})
	}
	return out, nil
}

// HotKeyReport is the latest report one producer stored for a hot-key
// pool: the reports the leader sums into the overflow set.
type HotKeyReport struct {
	Producer string
	Time     time.Time
	Keys     []hotkey.KeyRate // highest rate first
}

// HotKeyReports returns the producers' latest reports of pool, sorted by
// producer. Any replica answers, with a member token too. It returns an
// error wrapping ErrNotFound for an unknown pool.
func (a *Admin) HotKeyReports(ctx context.Context, pool string) ([]HotKeyReport, error) {
	resp, err := call(ctx, a.c, adminAPI.GetHotKeyReports, &keyshardv1.GetHotKeyReportsRequest{Pool: pool})
	if err != nil {
		return nil, fmt.Errorf("hot-key reports of pool %q: %w", pool, err)
	}
	out := make([]HotKeyReport, 0, len(resp.GetReports()))
	for _, r := range resp.GetReports() {
		rep := HotKeyReport{Producer: r.GetProducer(), Time: timeFromProto(r.GetTime())}
		for _, k := range r.GetKeys() {
			rep.Keys = append(rep.Keys, hotkey.KeyRate{Key: k.GetKey(), Rate: k.GetRate()})
		}
		out = append(out, rep)
	}
	return out, nil
}
