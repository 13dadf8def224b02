package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
)

// Display limits of `keyshard positions`.
const (
	histogramGroups = 10 // positions shown in the histogram
	fewRuns         = 16 // runs listed when there are at most this many
)

func newPositions(c *connFlags) *cobra.Command {
	var behind int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "positions KEYSPACE",
		Short: "Show a stream keyspace's committed positions: spread, histogram, the buckets furthest behind",
		Long: `Show a stream keyspace's committed positions: the minimum, maximum and
spread over every bucket, how many buckets are at each position (largest
groups first), the runs of buckets when there are few, and the buckets
furthest behind with the member holding them and its token.

A position is the position of the next event to read for a bucket; a held
bucket's is its holder's last commit (or where its grant started).`,
		Args: cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			if behind < 1 || behind > client.MaxPositionsBehind {
				return fmt.Errorf("--behind %d: want 1 to %d", behind, client.MaxPositionsBehind)
			}
			p, err := adm.Positions(cmd.Context(), args[0], behind)
			if err != nil {
				return c.explain(err)
			}
			if asJSON {
				// protojson varies its spacing on purpose: indent it
				// the same way every time.
				b, err := protojson.Marshal(positionsProto(p))
				if err != nil {
					return err
				}
				var buf bytes.Buffer
				if err := json.Indent(&buf, b, "", "  "); err != nil {
					return err
				}
				buf.WriteByte('\n')
				_, err = buf.WriteTo(cmd.OutOrStdout())
				return err
			}
			return printPositions(cmd.OutOrStdout(), args[0], p)
		}),
	}
	cmd.Flags().IntVar(&behind, "behind", 10, fmt.Sprintf("how many of the buckets furthest behind to list, 1 to %d", client.MaxPositionsBehind))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's answer (GetPositionsResponse) as JSON")
	cmd.AddCommand(newPositionsReset(c))
	return cmd
}

func newPositionsReset(c *connFlags) *cobra.Command {
	var bucketList string
	var all, yes bool
	var position uint64
	cmd := &cobra.Command{
		Use:   "reset KEYSPACE (--buckets 1,2,10-20 | --all) --position N --yes",
		Short: "Set the committed position of buckets nobody holds, also backwards (disaster recovery)",
		Long: `Set the committed position of buckets of a stream keyspace, also
backwards: for a stream restored from a backup, or a position past the
stream's end. The next member granted a bucket starts reading it there.

The buckets must be held by nobody: drain or stop their holders first. If
one is held, nothing is reset. Without --yes, it prints what it would do
and changes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			ks := args[0]
			var buckets []int
			switch set := cmd.Flags().Changed("buckets"); {
			case set && all:
				return errors.New("give --buckets or --all, not both")
			case !set && !all:
				return errors.New("name the buckets to reset: --buckets 1,2,10-20, or --all")
			case set:
				var err error
				if buckets, err = parseBuckets(bucketList); err != nil {
					return fmt.Errorf("--buckets %q: %w", bucketList, err)
				}
			}
			if !cmd.Flags().Changed("position") {
				return errors.New("--position is required: the position of the next event to read for each bucket")
			}
			if !yes {
				p, err := adm.Positions(cmd.Context(), ks, 1)
				if err != nil {
					return c.explain(err)
				}
				what := "every bucket"
				if !all {
					what = fmt.Sprintf("%d buckets (%s)", len(buckets), formatBuckets(buckets))
					if len(buckets) == 1 {
						what = fmt.Sprintf("bucket %d", buckets[0])
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "would reset %s of keyspace %s to position %d; they are at %s now\n", what, ks, position, positionRange(p, buckets))
				return errors.New("nothing reset: add --yes to reset")
			}
			var r client.PositionsReset
			var err error
			if all {
				r, err = adm.ResetAllPositions(cmd.Context(), ks, position)
			} else {
				r, err = adm.ResetPositions(cmd.Context(), ks, buckets, position)
			}
			if err != nil {
				return c.explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reset %d buckets of keyspace %s to position %d (revision %d)\n", r.Buckets, ks, position, r.Revision)
			return nil
		}),
	}
	cmd.Flags().StringVar(&bucketList, "buckets", "", "buckets to reset: numbers and ranges, like 1,2,10-20")
	cmd.Flags().BoolVar(&all, "all", false, "reset every bucket of the keyspace")
	cmd.Flags().Uint64Var(&position, "position", 0, "the position to set: the next event to read for each bucket")
	cmd.Flags().BoolVar(&yes, "yes", false, "do it (without it, only say what would be done)")
	return cmd
}

// parseBuckets parses "1,2,10-20": bucket numbers and inclusive ranges,
// each bucket once.
func parseBuckets(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		lo, hi, isRange := strings.Cut(item, "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || item == "" {
			return nil, fmt.Errorf("%q is not a bucket or a range of buckets (like 7 or 10-20)", item)
		}
		if last < first {
			return nil, fmt.Errorf("range %q ends before it starts", item)
		}
		if last >= 65536 {
			return nil, fmt.Errorf("bucket %d is above the largest possible, 65535", last)
		}
		for b := first; b <= last; b++ {
			if seen[b] {
				return nil, fmt.Errorf("bucket %d is listed twice", b)
			}
			seen[b] = true
			out = append(out, b)
		}
	}
	return out, nil
}

// formatBuckets writes buckets as parseBuckets reads them, ranges
// merged, sorted.
func formatBuckets(buckets []int) string {
	bs := slices.Sorted(slices.Values(buckets))
	var parts []string
	for i := 0; i < len(bs); {
		j := i
		for j+1 < len(bs) && bs[j+1] == bs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(bs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", bs[i], bs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// positionRange is "100" or "100..250": the positions of buckets (every
// bucket if nil) in p.
func positionRange(p client.Positions, buckets []int) string {
	var lo, hi uint64
	found := false
	in := map[int]bool{}
	for _, b := range buckets {
		in[b] = true
	}
	for _, r := range p.Runs {
		for b := r.First; b < r.First+r.Count; b++ {
			if buckets != nil && !in[b] {
				continue
			}
			if !found {
				lo, hi, found = r.Position, r.Position, true
			}
			lo, hi = min(lo, r.Position), max(hi, r.Position)
			if buckets == nil {
				break // the run's other buckets are at the same position
			}
		}
	}
	switch {
	case !found:
		return "no position (outside the keyspace)"
	case lo == hi:
		return strconv.FormatUint(lo, 10)
	}
	return fmt.Sprintf("%d..%d", lo, hi)
}

func printPositions(out io.Writer, ks string, p client.Positions) error {
	buckets := 0
	count := map[uint64]int{}
	for _, r := range p.Runs {
		buckets += r.Count
		count[r.Position] += r.Count
	}
	fmt.Fprintf(out, "keyspace %s: %d buckets, epoch %d, revision %d\n", ks, buckets, p.Epoch, p.Revision)
	fmt.Fprintf(out, "min %d  max %d  spread %d\n", p.Min, p.Max, p.Spread)

	groups := make([]uint64, 0, len(count))
	for pos := range count {
		groups = append(groups, pos)
	}
	slices.SortFunc(groups, func(a, b uint64) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		if a < b {
			return -1
		}
		return 1
	})
	fmt.Fprintf(out, "\nbuckets per position (%d distinct):\n", len(groups))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	const width = 40
	for _, pos := range groups[:min(len(groups), histogramGroups)] {
		bar := strings.Repeat("█", max(1, count[pos]*width/max(buckets, 1)))
		fmt.Fprintf(tw, "  %d\t%d\t %s\n", pos, count[pos], bar)
	}
	tw.Flush()
	if rest := groups[min(len(groups), histogramGroups):]; len(rest) > 0 {
		n := 0
		for _, pos := range rest {
			n += count[pos]
		}
		fmt.Fprintf(out, "  ... %d more positions, %d buckets\n", len(rest), n)
	}

	if len(p.Runs) <= fewRuns {
		fmt.Fprintln(out, "\nruns:")
		for _, r := range p.Runs {
			span := "bucket " + strconv.Itoa(r.First)
			if r.Count > 1 {
				span = fmt.Sprintf("buckets %d-%d", r.First, r.First+r.Count-1)
			}
			fmt.Fprintf(out, "  %s at %d\n", span, r.Position)
		}
	} else {
		fmt.Fprintf(out, "\n%d runs (more than %d; --json lists them)\n", len(p.Runs), fewRuns)
	}

	fmt.Fprintf(out, "\nfurthest behind:\n")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  BUCKET\tPOSITION\tBEHIND MAX\tMEMBER\tTOKEN")
	for _, b := range p.Behind {
		token := "-"
		if b.Token != 0 {
			token = strconv.FormatUint(b.Token, 10)
		}
		fmt.Fprintf(tw, "  %d\t%d\t%d\t%s\t%s\n", b.Bucket, b.Position, p.Max-b.Position, orNone(b.Member), token)
	}
	return tw.Flush()
}

// positionsProto is p as the API answered it.
func positionsProto(p client.Positions) *keyshardv1.GetPositionsResponse {
	r := &keyshardv1.GetPositionsResponse{Min: p.Min, Max: p.Max, Spread: p.Spread, Epoch: p.Epoch, Revision: p.Revision}
	for _, run := range p.Runs {
		r.Runs = append(r.Runs, &keyshardv1.PositionRun{First: uint32(run.First), Count: uint32(run.Count), Position: run.Position})
	}
	for _, b := range p.Behind {
		r.Behind = append(r.Behind, &keyshardv1.BucketBehind{Bucket: uint32(b.Bucket), Position: b.Position, Member: b.Member, Token: b.Token})
	}
	return r
}
