package chaos

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// ParseHistory reads a hand-written history, one record a line, for the
// checker's tests and for replaying a suspicious record by hand:
//
//	# a comment
//	[@<offset>] <verb> <worker> [<bucket> <token>] [fenced] [accepted|refused] [pid=N] [err=TEXT]
//
// Verbs: acquire, releasing, release, write (with bucket and token);
// joined, fenced, stop, cont, kill, proven, fault-end, fault-settled
// (worker only); fault-begin <kind> <target>. @offset (a Go duration)
// stamps the record that long after the first; without it a record comes
// 10 ms after the one before. Records pass through the sink's fencing
// (History.Add), which sets Refused; accepted or refused forces the
// outcome, to forge a sink that fences wrongly. The returned history
// holds the records as recorded.
func ParseHistory(r io.Reader) ([]Record, error) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := base
	h := NewHistory()
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if strings.HasPrefix(f[0], "@") {
			d, err := time.ParseDuration(f[0][1:])
			if err != nil {
				return nil, fmt.Errorf("line %d: offset %q: want @<duration> such as @1.5s", line, f[0])
			}
			at, f = base.Add(d), f[1:]
		} else {
			at = at.Add(10 * time.Millisecond)
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: %q: want <verb> <worker> ...", line, text)
		}
		rec := Record{Worker: f[1], At: at}
		args := f[2:]
		force := ""
		switch verb := f[0]; verb {
		case "acquire", "releasing", "release", "write":
			rec.Kind = verb
			if len(args) < 2 {
				return nil, fmt.Errorf("line %d: %s needs a bucket and a token", line, verb)
			}
			b, err1 := strconv.Atoi(args[0])
			t, err2 := strconv.ParseUint(args[1], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("line %d: bucket %q and token %q must be numbers", line, args[0], args[1])
			}
			rec.Bucket, rec.Token, args = b, t, args[2:]
		case "joined", "fenced":
			rec.Kind = verb
		case "stop", "cont", "kill":
			rec.Kind = "fault:" + verb
		case "proven", "fault-end", "fault-settled":
			rec.Kind = map[string]string{"proven": FaultProven, "fault-end": FaultEnd, "fault-settled": FaultSettled}[verb]
		case "fault-begin":
			if len(args) < 1 {
				return nil, fmt.Errorf("line %d: fault-begin <kind> <target>", line)
			}
			rec.Kind, rec.Err, rec.Worker, args = FaultBegin, f[1], args[0], args[1:]
		default:
			return nil, fmt.Errorf("line %d: unknown verb %q", line, verb)
		}
		for _, a := range args {
			switch {
			case a == "fenced":
				rec.Fenced = true
			case a == "accepted" || a == "refused":
				force = a
			case strings.HasPrefix(a, "pid="):
				pid, err := strconv.Atoi(a[4:])
				if err != nil {
					return nil, fmt.Errorf("line %d: %q: pid must be a number", line, a)
				}
				rec.Pid = pid
			case strings.HasPrefix(a, "err="):
				rec.Err = a[4:]
			default:
				return nil, fmt.Errorf("line %d: unknown word %q", line, a)
			}
		}
		rec = h.Add(rec)
		if force != "" {
			h.Recs[len(h.Recs)-1].Refused = force == "refused"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return h.Recs, nil
}
