package cluster

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRealNodePrerequisitesNameWhatIsMissing(t *testing.T) {
	err := RealNodePrerequisites(t.TempDir())
	if err == nil {
		t.Fatal("no error for an empty bin directory")
	}
	for _, want := range []string{"bin/k8s/kubelet (make tools)", "bin/node/containerd (make tools)", "bin/cni/bridge (make tools)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a\040b`:   "/tmp/a b",
		`/plain/path`:   "/plain/path",
		`/tab\011x\134`: "/tab\tx\\",
		`/end\04`:       `/end\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNodeNetworkNamesAndRanges(t *testing.T) {
	n := &nodeNet{slot: 7}
	for got, want := range map[string]string{
		n.netns(): "hwnode-7", n.hostLink(): "hwh7", n.bridge(): "hwbr7",
		n.hostIP(): "10.249.7.1", n.nodeIP(): "10.249.7.2",
		n.podSubnet(): "10.248.7.0/24", n.podGateway(): "10.248.7.1", n.metric(): "4007",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	var cfg struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPMasq *bool  `json:"ipMasq"`
			IPAM   struct {
				Ranges [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(cniConfig(n, "/x")), &cfg); err != nil {
		t.Fatalf("CNI config is not JSON: %v", err)
	}
	br := cfg.Plugins[0]
	if cfg.Name != "hwnode-7" || br.Type != "bridge" || br.Bridge != "hwbr7" || br.IPMasq == nil || *br.IPMasq ||
		br.IPAM.Ranges[0][0].Subnet != "10.248.7.0/24" {
		t.Errorf("CNI config: %+v", cfg)
	}
}
