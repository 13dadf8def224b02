package store

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapToSlog returns a zap logger (etcd logs through zap) that forwards
// records at min or above to h. A nil h discards everything.
//
// Once *closing is true (closing may be nil), records are demoted to debug
// level: etcd logs the end of its listeners during a normal shutdown as
// errors ("setting up serving from embedded etcd failed").
func zapToSlog(h slog.Handler, min zapcore.Level, name string, closing *atomic.Bool) *zap.Logger {
	if h == nil {
		return zap.NewNop()
	}
	if closing == nil {
		closing = new(atomic.Bool)
	}
	return zap.New(&slogCore{h: h.WithAttrs([]slog.Attr{slog.String("component", name)}), min: min, closing: closing})
}

// slogCore is a zapcore.Core writing to a slog.Handler.
type slogCore struct {
	h       slog.Handler
	min     zapcore.Level
	closing *atomic.Bool
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (c *slogCore) level(l zapcore.Level) zapcore.Level {
	if c.closing.Load() {
		return zapcore.DebugLevel
	}
	return l
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	l = c.level(l)
	return l >= c.min && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	if len(fs) == 0 {
		return c
	}
	return &slogCore{h: c.h.WithAttrs(fieldAttrs(fs)), min: c.min, closing: c.closing}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(c.level(e.Level)), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(fieldAttrs(fs)...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

func fieldAttrs(fs []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := slices.Sorted(maps.Keys(enc.Fields))
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	return attrs
}
