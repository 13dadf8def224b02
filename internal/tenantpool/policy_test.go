package tenantpool

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/placement"
)

func goodPolicy() Policy {
	return Policy{CapacityPerMember: 10, Headroom: 1, ShrinkCooldown: 5 * time.Minute, Lookback: time.Minute, WarmUp: 30 * time.Second}
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		field string
		edit  func(*Policy)
	}{
		{"CapacityPerMember", func(p *Policy) { p.CapacityPerMember = 0 }},
		{"CapacityPerMember", func(p *Policy) { p.CapacityPerMember = math.NaN() }},
		{"Headroom", func(p *Policy) { p.Headroom = -1 }},
		{"Headroom", func(p *Policy) { p.Headroom = math.Inf(1) }},
		{"MinSize", func(p *Policy) { p.MinSize = -1 }},
		{"MaxSize", func(p *Policy) { p.MaxSize = -1 }},
		{"MaxSize", func(p *Policy) { p.MinSize, p.MaxSize = 5, 3 }},
		{"ShrinkCooldown", func(p *Policy) { p.ShrinkCooldown = -1 }},
		{"MaxShrinkStep", func(p *Policy) { p.MaxShrinkStep = -1 }},
		{"Lookback", func(p *Policy) { p.Lookback = -1 }},
		{"WarmUp", func(p *Policy) { p.WarmUp = -1 }},
		{"Tolerance", func(p *Policy) { p.Tolerance = -0.1 }},
		{"RebalanceMoves", func(p *Policy) { p.RebalanceMoves = -1 }},
		{"ForgetAfter", func(p *Policy) { p.ForgetAfter = -1 }},
		{`Overrides[""]`, func(p *Policy) { p.Overrides = map[string]Override{"": {Size: 1}} }},
		{`Overrides["a"].Size`, func(p *Policy) { p.Overrides = map[string]Override{"a": {Size: -1}} }},
		{`Overrides["a"].Size`, func(p *Policy) { p.Overrides = map[string]Override{"a": {Size: 3, MinSize: 2}} }},
		{`Overrides["a"].MinSize`, func(p *Policy) { p.Overrides = map[string]Override{"a": {MinSize: -2}} }},
		{`Overrides["a"].MaxSize`, func(p *Policy) { p.Overrides = map[string]Override{"a": {MaxSize: -2}} }},
		{`Overrides["b"].MaxSize`, func(p *Policy) {
			p.MinSize = 4
			p.Overrides = map[string]Override{"a": {MinSize: 1}, "b": {MaxSize: 2}}
		}},
	}
	if err := goodPolicy().Validate(); err != nil {
		t.Fatalf("good policy: %v", err)
	}
	for _, tt := range tests {
		p := goodPolicy()
		tt.edit(&p)
		err := p.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want a *FieldError wrapping ErrInvalid", tt.field, err)
			continue
		}
		if fe.Field != tt.field || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("got field %q (%v), want %q", fe.Field, err, tt.field)
		}
	}
}

func TestPolicySizePolicy(t *testing.T) {
	p := goodPolicy()
	p.MinSize, p.MaxSize, p.ZoneAware, p.MaxShrinkStep = 2, 30, true, 3
	p.Overrides = map[string]Override{"fixed": {Size: 7}, "big": {MinSize: 10}}
	tests := []struct {
		tenant string
		zones  int
		want   placement.SizePolicy
	}{
		{"x", 3, placement.SizePolicy{CapacityPerMember: 10, Headroom: 1, Min: 2, Max: 30, Zones: 3, ShrinkCooldown: 5 * time.Minute, MaxShrinkStep: 3}},
		{"big", 3, placement.SizePolicy{CapacityPerMember: 10, Headroom: 1, Min: 10, Max: 30, Zones: 3, ShrinkCooldown: 5 * time.Minute, MaxShrinkStep: 3}},
		{"fixed", 3, placement.SizePolicy{CapacityPerMember: 10, Headroom: 1, Min: 7, Max: 7, Zones: 1, MaxShrinkStep: 7}},
	}
	for _, tt := range tests {
		got := p.SizePolicy(tt.tenant, tt.zones)
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", tt.tenant, d)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%s: %v", tt.tenant, err)
		}
	}
	p.ZoneAware = false
	if got := p.SizePolicy("x", 3).Zones; got != 1 {
		t.Errorf("zone-unaware: Zones %d, want 1", got)
	}
}
