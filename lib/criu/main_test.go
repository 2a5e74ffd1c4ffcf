package criu

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	MaybeKdatHelper()
	os.Exit(m.Run())
}
