package supervisor

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// mdLink is a markdown link: its text stands for it.
var mdLink = regexp.MustCompile(`\[([^]]*)\]\([^)]*\)`)

// settingsDoc is the page whose table describes every setting.
const settingsDoc = "../docs/configuration.md"

// TestReadmeSettings: the configuration table of docs/configuration.md (the
// README's until it moved there) says what Config's tags say, row for row:
// variable, default, accepted values and meaning (the page's code spans and
// link targets aside). A setting is added in one place, its field, plus its
// row there; this fails when the two disagree.
func TestReadmeSettings(t *testing.T) {
	b, err := os.ReadFile(settingsDoc)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `"+EnvPrefix) {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		for i := range cells {
			cells[i] = mdLink.ReplaceAllString(strings.ReplaceAll(strings.TrimSpace(cells[i]), "`", ""), "$1")
		}
		rows = append(rows, cells)
	}
	var tags [][]string
	ct := reflect.TypeOf(Config{})
	for i := 0; i < ct.NumField(); i++ {
		f := ct.Field(i)
		def, ok := f.Tag.Lookup("envDefault")
		if !ok {
			def = "(none)"
		}
		if f.Tag.Get("accepts") == "" || f.Tag.Get("meaning") == "" {
			t.Errorf("%s has no accepts or meaning tag", f.Name)
		}
		tags = append(tags, []string{EnvPrefix + f.Tag.Get("env"), def, f.Tag.Get("accepts"), f.Tag.Get("meaning")})
	}
	if diff := cmp.Diff(tags, rows); diff != "" {
		t.Errorf("%s's configuration table (+) and Config's tags (-) disagree:\n%s", settingsDoc, diff)
	}
}
