package consent_test

import (
	"fmt"

	"github.com/sluicehq/sluice/consent"
)

// Replies to a marketing text, as the inbound webhook would read them: the
// FCC's words opt out whatever the case or punctuation, START opts back
// in, and a reply that only reads like a revocation goes to a person.
func ExampleClassify() {
	words := consent.Keywords{OptOut: []string{"BAJA"}}
	for _, body := range []string{"Stop.", "opt-out", "baja", "START", "help?", "please stop texting me", "Don't text me", "See you at 5"} {
		c := consent.Classify(body, words)
		fmt.Printf("%-24q %-8v %s\n", body, c.Intent, c.Keyword)
	}
	// Output:
	// "Stop."                  opt-out  STOP
	// "opt-out"                opt-out  OPT OUT
	// "baja"                   opt-out  BAJA
	// "START"                  opt-in   START
	// "help?"                  help     HELP
	// "please stop texting me" review   STOP
	// "Don't text me"          review   DONT TEXT
	// "See you at 5"           none
}
