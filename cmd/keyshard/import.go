package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/placement"
)

// importFlags are keyshard keyspace import's flags.
type importFlags struct {
	instance      []string // --instance ID[=POSITION], repeated, in order
	instances     []string // --instances a,b,c
	positionsFile string
	mode          string
	buckets       int
	wait          time.Duration
	leaseTTL      time.Duration
	drainTimeout  time.Duration
}

// Bounds of --wait-for-instances, as the server checks them.
const (
	defaultImportWait = 10 * time.Minute
	maxImportWait     = 24 * time.Hour
)

func importCommand(c *connFlags) *cobra.Command {
	var f importFlags
	cmd := &cobra.Command{
		Use:   "import NAME --instance ID[=POSITION] --instance ID[=POSITION] ...",
		Short: "Create a keyspace that takes over a static sha256(key) mod N mapping with zero moves",
		Long: `Create keyspace NAME whose first map reproduces a static mapping exactly:
Synapse's int.from_bytes(sha256(key), "little") % N over the N instances in
the order given (the order of Synapse's instance list). The keyspace hashes
with synapse-sha256; its bucket count is a multiple of N (by default the
multiple nearest 4096: 4096 for 4 instances, 4095 for 3). In a stream
keyspace each instance's position (the position of the next event it would
read: for Synapse's federation_stream_position, its stream_id + 1) becomes
the position of each of its buckets.

Start the instances as Keyshard members with the member ids given: each is
granted exactly the buckets it had (from its position), so nothing moves and
nothing is reprocessed. Until an instance joins, its buckets wait for it,
granted to nobody, for at most --wait-for-instances; then they are placed
over the members present. A member that joins later takes the minimum
(about buckets/(N+1)).`,
		Example: `  keyshard keyspace import federation --mode stream \
    --instance sender1=120394 --instance sender2=120211 --instance sender3=120377
  keyshard keyspace import persisters --instances persister1,persister2
  keyshard keyspace import federation --mode stream --positions-file positions.txt`,
		Args: cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			imp, err := f.request(args[0])
			if err != nil {
				return err
			}
			got, err := adm.ImportKeyspace(cmd.Context(), imp)
			if err != nil {
				return c.explain(importFlagError(err, f))
			}
			printImport(cmd.OutOrStdout(), imp, got)
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.instance, "instance", nil, "an instance as ID or ID=POSITION, once per instance, in the order of the static mapping")
	fl.StringSliceVar(&f.instances, "instances", nil, "the instances, comma-separated, in order (instead of --instance, without positions)")
	fl.StringVar(&f.positionsFile, "positions-file", "", `positions by instance, one "ID POSITION" (or ID=POSITION) per line; without --instance(s), its lines name the instances in order`)
	fl.StringVar(&f.mode, "mode", client.ModeExclusive, `"exclusive" or "stream" (stream keyspaces take positions)`)
	fl.IntVar(&f.buckets, "buckets", 0, "bucket count, a multiple of the number of instances (0: the multiple nearest 4096)")
	fl.DurationVar(&f.wait, "wait-for-instances", defaultImportWait, "how long buckets wait for an instance that has not joined, at most 24h")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 10*time.Second, "member session lifetime without keep-alive (whole seconds, >= 2s)")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "time a member may take to release a moved bucket before its session is revoked")
	return cmd
}

// request checks the flags and builds the import; errors name the flag.
func (f importFlags) request(name string) (client.KeyspaceImport, error) {
	imp := client.KeyspaceImport{
		Keyspace:         client.KeyspaceConfig{Name: name, Buckets: f.buckets, Hash: placement.HashSynapse, Mode: f.mode, LeaseTTL: f.leaseTTL, DrainTimeout: f.drainTimeout},
		WaitForInstances: f.wait,
	}
	switch f.mode {
	case client.ModeExclusive, client.ModeStream:
	default:
		return imp, fmt.Errorf("--mode %q: use %q or %q", f.mode, client.ModeExclusive, client.ModeStream)
	}
	stream := f.mode == client.ModeStream
	if f.wait <= 0 || f.wait > maxImportWait {
		return imp, fmt.Errorf("--wait-for-instances %v: want more than 0 and at most %v", f.wait, maxImportWait)
	}
	if len(f.instance) > 0 && len(f.instances) > 0 {
		return imp, errors.New("--instance and --instances: use one of them")
	}
	var filePos map[string]uint64
	var fileOrder []string
	if f.positionsFile != "" {
		var err error
		if filePos, fileOrder, err = readPositions(f.positionsFile); err != nil {
			return imp, err
		}
		if !stream {
			return imp, fmt.Errorf("--positions-file: positions are for --mode stream")
		}
	}

	type inst struct {
		flag   string // how the flags named it, for errors
		id     string
		pos    uint64
		hasPos bool
	}
	var list []inst
	switch {
	case len(f.instance) > 0:
		for _, s := range f.instance {
			id, p, hasPos := strings.Cut(s, "=")
			in := inst{flag: "--instance " + s, id: id, hasPos: hasPos}
			if hasPos {
				v, err := strconv.ParseUint(p, 10, 64)
				if err != nil {
					return imp, fmt.Errorf("--instance %s: position %q is not a whole number from 0 to %d", s, p, uint64(1<<64-1))
				}
				in.pos = v
			}
			list = append(list, in)
		}
	case len(f.instances) > 0:
		for _, id := range f.instances {
			list = append(list, inst{flag: "--instances " + strings.Join(f.instances, ","), id: id})
		}
	default:
		for _, id := range fileOrder {
			list = append(list, inst{flag: "--positions-file " + f.positionsFile, id: id})
		}
	}
	if len(list) == 0 {
		return imp, errors.New("--instance: name the instances in the order of the static mapping, e.g. --instance sender1=POSITION --instance sender2=POSITION")
	}
	seen := map[string]string{}
	for i, in := range list {
		if in.id == "" {
			return imp, fmt.Errorf("%s: instance %d has an empty member id", in.flag, i+1)
		}
		if prev, ok := seen[in.id]; ok {
			return imp, fmt.Errorf("%s: %q is named twice (also by %s); name each instance once", in.flag, in.id, prev)
		}
		seen[in.id] = in.flag
		if p, ok := filePos[in.id]; ok {
			if in.hasPos && in.pos != p {
				return imp, fmt.Errorf("%s: position %d, but --positions-file says %d", in.flag, in.pos, p)
			}
			in.pos, in.hasPos = p, true
		}
		switch {
		case in.hasPos && !stream:
			return imp, fmt.Errorf("%s: positions are for --mode stream", in.flag)
		case !in.hasPos && stream:
			return imp, fmt.Errorf("%s: %s has no position; a stream import needs each instance's position (%s=POSITION, or a line in --positions-file; 0 reads from the start of the stream)", in.flag, in.id, in.id)
		}
		imp.Instances = append(imp.Instances, client.ImportInstance{Member: in.id, Position: in.pos})
	}
	for _, id := range slices.Sorted(maps.Keys(filePos)) { // the first in order: the same error every run
		if _, ok := seen[id]; !ok {
			return imp, fmt.Errorf("--positions-file %s: %q is not one of the instances", f.positionsFile, id)
		}
	}
	if f.buckets != 0 {
		ids := make([]string, len(imp.Instances))
		for i, in := range imp.Instances {
			ids[i] = in.Member
		}
		if _, err := placement.SynapseAssignment(f.buckets, ids); err != nil {
			return imp, fmt.Errorf("--buckets %d: %s", f.buckets, strings.TrimPrefix(err.Error(), placement.ErrInvalid.Error()+": "))
		}
	}
	return imp, nil
}

// readPositions reads a positions file: "ID POSITION" or "ID=POSITION"
// per line; blank lines and lines starting with # are skipped. It returns
// the positions and the ids in the file's order.
func readPositions(path string) (map[string]uint64, []string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--positions-file: %w", err)
	}
	defer fh.Close()
	pos := map[string]uint64{}
	var order []string
	sc := bufio.NewScanner(fh)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(strings.Replace(line, "=", " ", 1))
		if len(fields) != 2 {
			return nil, nil, fmt.Errorf("--positions-file %s:%d: %q; want \"ID POSITION\"", path, n, line)
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("--positions-file %s:%d: position %q is not a whole number", path, n, fields[1])
		}
		if _, dup := pos[fields[0]]; dup {
			return nil, nil, fmt.Errorf("--positions-file %s:%d: %q is listed twice", path, n, fields[0])
		}
		pos[fields[0]] = v
		order = append(order, fields[0])
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("--positions-file %s: %w", path, err)
	}
	return pos, order, nil
}

// importFlagError names the flag behind an error of ImportKeyspace.
func importFlagError(err error, f importFlags) error {
	var ae *client.ArgError
	if errors.As(err, &ae) {
		var i int
		if _, scanErr := fmt.Sscanf(ae.Arg, "KeyspaceImport.Instances[%d].Member", &i); scanErr == nil {
			flag := "--instances " + strings.Join(f.instances, ",")
			switch {
			case i < len(f.instance):
				flag = "--instance " + f.instance[i]
			case len(f.instances) == 0:
				flag = "--positions-file " + f.positionsFile
			}
			return fmt.Errorf("%s: member id %s", flag, ae.Reason)
		}
		switch ae.Arg {
		case "keyspace name":
			return fmt.Errorf("NAME: keyspace name %s", ae.Reason)
		case "KeyspaceConfig.LeaseTTL":
			return fmt.Errorf("--lease-ttl: %s", ae.Reason)
		case "KeyspaceConfig.DrainTimeout":
			return fmt.Errorf("--drain-timeout: %s", ae.Reason)
		}
		return err
	}
	msg := err.Error()
	for _, m := range []struct{ field, flag string }{
		{"keyspace.name", "NAME"}, {"keyspace.buckets", "--buckets"}, {"keyspace.lease_ttl", "--lease-ttl"},
		{"keyspace.drain_timeout", "--drain-timeout"}, {"wait_for_instances", "--wait-for-instances"}, {"].member", "--instance"}, {"].position", "--instance"},
	} {
		if strings.Contains(msg, m.field) {
			return fmt.Errorf("%s: %w", m.flag, err)
		}
	}
	return err
}

// printImport prints what was imported and what to do next.
func printImport(out io.Writer, imp client.KeyspaceImport, got client.ImportedKeyspace) {
	k := got.Keyspace
	n := len(imp.Instances)
	fmt.Fprintf(out, "imported keyspace %s: %d buckets, hash %s, mode %s, lease TTL %v, drain timeout %v\n", k.Name, k.Buckets, k.Hash, k.Mode, k.LeaseTTL, k.DrainTimeout)
	if imp.Keyspace.Buckets == 0 {
		fmt.Fprintf(out, "(%d buckets: the multiple of %d instances nearest 4096)\n", k.Buckets, n)
	}
	fmt.Fprintf(out, "map epoch %d reproduces sha256(key) mod %d: instance i owns the buckets b with b mod %d = i\n\n", got.Epoch, n, n)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	stream := k.Mode == client.ModeStream
	if stream {
		fmt.Fprintln(tw, "INSTANCE\tMEMBER ID\tBUCKETS\tPOSITION")
	} else {
		fmt.Fprintln(tw, "INSTANCE\tMEMBER ID\tBUCKETS")
	}
	for i, in := range imp.Instances {
		b := 0
		if i < len(got.Buckets) {
			b = got.Buckets[i]
		}
		if stream {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\n", i, in.Member, b, in.Position)
		} else {
			fmt.Fprintf(tw, "%d\t%s\t%d\n", i, in.Member, b)
		}
	}
	tw.Flush()
	wait := imp.WaitForInstances
	if wait == 0 {
		wait = defaultImportWait
	}
	fmt.Fprintf(out, "\nNext: start each instance as a member of %s with the member id above.\n", k.Name)
	if stream {
		fmt.Fprintln(out, "Each is granted exactly its buckets, from its position: nothing moves, nothing is reprocessed.")
	} else {
		fmt.Fprintln(out, "Each is granted exactly its buckets: nothing moves.")
	}
	fmt.Fprintf(out, "Until an instance joins, its buckets wait for it (granted to nobody), for at most %v;\n", wait)
	fmt.Fprintln(out, "then they are placed over the members present. Check with `keyshard members "+k.Name+"`.")
}
