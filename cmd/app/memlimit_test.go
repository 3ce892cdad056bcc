package app

import "testing"

func TestSoftMemoryLimit(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want int64
		err  bool
	}{
		{"unset", nil, 0, false},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "100MiB", MemoryLimitEnv: "268435456"}, 0, false},
		{"256Mi", map[string]string{MemoryLimitEnv: "268435456"}, 241591910, false},
		{"garbage", map[string]string{MemoryLimitEnv: "256Mi"}, 0, true},
		{"zero", map[string]string{MemoryLimitEnv: "0"}, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := SoftMemoryLimit(func(k string) string { return c.env[k] })
			if (err != nil) != c.err || got != c.want {
				t.Fatalf("got %d, %v; want %d, error %v", got, err, c.want, c.err)
			}
		})
	}
}
