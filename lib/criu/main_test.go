package criu

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	MaybeKdatHelper()
	if dir := os.Getenv(serviceOwnerEnv); dir != "" {
		serviceOwner(dir)
	}
	os.Exit(m.Run())
}

// serviceOwnerEnv makes the test binary a process that starts a criu service, prints the
// service's pid and waits to be killed (TestServiceDiesWithOwner).
const serviceOwnerEnv = "LF_TEST_SERVICE_OWNER"

func serviceOwner(kdatDir string) {
	s, err := StartService(context.Background(), kdatDir, "")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(s.cmd.Process.Pid)
	time.Sleep(time.Minute)
	os.Exit(1)
}
