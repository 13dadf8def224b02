package dashboard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/store"
)

// TestDashboardOnFollower opens the page on a replica that does not lead
// (two keyshard serve processes on one etcd): the overview names both
// replicas and the other as leader, and the keyspace page shows the map
// GetMap answers, the members' leases and the epoch history — every call
// the page makes is the public API, which any replica answers.
func TestDashboardOnFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two keyshard serve processes and chromium; skipped with -short")
	}
	p := newPage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	eps := strings.Join(etcd.Endpoints(), ",")
	r1 := startServe(t, "--replica", "r1", "--etcd-endpoints", eps)
	leader := func(s *serve) string {
		var st struct {
			Leader string `json:"leader"`
		}
		s.mustCall(t, "", "AdminService/Status", map[string]any{}, &st)
		return st.Leader
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		l := leader(r1)
		return l == "r1", fmt.Sprintf("leader %q; want r1", l)
	})
	r2 := startServe(t, "--replica", "r2", "--etcd-endpoints", eps)
	c, err := client.Dial(r2.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Admin().CreateKeyspace(ctx, client.KeyspaceConfig{Name: "rooms", Buckets: 128, LeaseTTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, c, "rooms", "w1")
	startWorker(t, c, "rooms", "w2")

	p.run("the overview on r2", 20*time.Second, chromedp.Navigate(r2.url+"/ui/#/"), chromedp.WaitVisible(chromedp.CSS(`#keyspaces tr[data-keyspace="rooms"]`)))
	p.waitJS("r2 answering, r1 leading, both listed", 15*time.Second, `(() => {
		const ov = document.querySelector('#ov-cluster'); if (!ov) return false;
		return !!ov.querySelector('[data-replica="r2"]') && !!ov.querySelector('[data-leader="r1"]') &&
		  ov.textContent.includes('r1') && [...ov.querySelectorAll('li')].some((li) => li.textContent.startsWith('r2'));
	})()`)
	p.screenshot("follower-overview")
	p.run("the keyspace on r2", 20*time.Second, chromedp.Navigate(r2.url+"/ui/#/keyspace/rooms"), chromedp.WaitVisible(chromedp.CSS(`#legend li[data-member]`)))
	eventually(t, 20*time.Second, func() (bool, string) {
		epoch, want := r2.mapCounts(t, "", "rooms")
		pageEpoch, got := p.legend()
		return pageEpoch == epoch && sameCounts(got, want) && len(want) == 2,
			fmt.Sprintf("page at epoch %s shows %v; GetMap at epoch %s says %v", pageEpoch, got, epoch, want)
	})
	p.waitJS("leases and the history on r2", 15*time.Second, `(() => {
		const r = document.querySelector('#members-table tr[data-member="w2"]'); if (!r) return false;
		const rows = [...document.querySelectorAll('#history-table tbody tr')].map((tr) => tr.textContent);
		return r.querySelectorAll('td')[4].textContent.trim() !== '—' && rows.some((x) => x.includes('join') && x.includes('w2'));
	})()`)
	p.screenshot("follower-keyspace")
}
