package placement

// Unassigned marks a bucket that no member owns in Assignment.Owners.
const Unassigned int32 = -1

// Assignment is the owner of every bucket of one keyspace. Owners has one
// entry per bucket: an index into Members, or Unassigned. Members may name
// members that own nothing (and, in an input, members that have left).
//
// The compact form is also the wire form: a client in any language needs
// only the member list and one small integer per bucket.
type Assignment struct {
	Members []string
	Owners  []int32
}

// NewAssignment returns an assignment of the given number of buckets, all
// unassigned.
func NewAssignment(buckets int) Assignment {
	a := Assignment{Owners: make([]int32, buckets)}
	for i := range a.Owners {
		a.Owners[i] = Unassigned
	}
	return a
}

// Buckets returns the number of buckets.
func (a Assignment) Buckets() int { return len(a.Owners) }

// Owner returns the ID of the owner of bucket b, or "" if b is unassigned
// or out of range.
func (a Assignment) Owner(b int) string {
	if b < 0 || b >= len(a.Owners) {
		return ""
	}
	o := a.Owners[b]
	if o < 0 || int(o) >= len(a.Members) {
		return ""
	}
	return a.Members[o]
}

// Counts returns the number of buckets each member owns. Members that own
// nothing are absent.
func (a Assignment) Counts() map[string]int {
	// Counted per member index, then named: one map write per member, not
	// one per bucket.
	n := make([]int, len(a.Members))
	for _, o := range a.Owners {
		if o >= 0 && int(o) < len(n) {
			n[o]++
		}
	}
	c := make(map[string]int, len(a.Members))
	for i, k := range n {
		if k > 0 && a.Members[i] != "" {
			c[a.Members[i]] += k
		}
	}
	return c
}

// Validate returns an error wrapping ErrInvalid if the bucket count is out
// of range, a member ID is empty or repeated, or an owner index points
// outside Members.
func (a Assignment) Validate() error {
	if err := validateBuckets(len(a.Owners)); err != nil {
		return err
	}
	seen := make(map[string]bool, len(a.Members))
	for i, id := range a.Members {
		if id == "" {
			return invalidf("assignment member %d has an empty ID", i)
		}
		if seen[id] {
			return invalidf("assignment member %q appears twice", id)
		}
		seen[id] = true
	}
	for b, o := range a.Owners {
		if o != Unassigned && (o < 0 || int(o) >= len(a.Members)) {
			return invalidf("bucket %d has owner index %d; want %d (unassigned) or an index below %d", b, o, Unassigned, len(a.Members))
		}
	}
	return nil
}

// Clone returns a deep copy of a.
func (a Assignment) Clone() Assignment {
	return Assignment{
		Members: append([]string(nil), a.Members...),
		Owners:  append([]int32(nil), a.Owners...),
	}
}
