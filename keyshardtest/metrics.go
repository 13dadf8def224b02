package keyshardtest

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Metric returns the value of the Prometheus metric name that the
// keyshard serve at url exposes on /metrics, summed over its series (its
// labels); it fails tb if no series of it is exposed or one is not a
// number.
func Metric(tb testing.TB, url, name string) float64 {
	tb.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		sp := strings.LastIndexByte(rest, ' ')
		f, err := strconv.ParseFloat(rest[sp+1:], 64)
		if err != nil {
			tb.Fatalf("%s: %v", line, err)
		}
		sum, found = sum+f, true
	}
	if found {
		return sum
	}
	tb.Fatalf("no series %s on %s/metrics", name, url)
	return 0
}
