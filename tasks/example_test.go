package tasks_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// Build the task a producer enqueues. The notification id is the task id,
// so enqueueing the same id twice is refused (tasks.ErrDuplicate). With a
// key ring the payload is sealed: Redis holds no recipient or body in clear.
func ExampleNewTask() {
	keys, err := tasks.ParseKeyring("k1:q2pGKnJ0Qy1AJb4mJqXO2bIH7Q0gFzl8c3WJ5sO9nGU=")
	if err != nil {
		fmt.Println(err)
		return
	}
	n := tasks.NewSMS("acme", "+1 (415) 555-0100", "Your code is 123456")
	n.ID = "0190a5e2-7c1e-7d4e-9a3b-2f1c0d9e8b7a" // normally left to NewSMS (a UUIDv7)
	n.EnqueuedAt = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	task, err := tasks.NewTask(n, keys)
	if err != nil {
		fmt.Println("invalid:", err)
		return
	}
	fmt.Println(task.Type())
	fmt.Println(strings.HasPrefix(string(task.Payload()), "sealed.v1.k1."), strings.Contains(string(task.Payload()), "4155550100"))
	back, err := tasks.Open(keys, n.ID, task.Type(), task.Payload(), false)
	fmt.Println(back.To, back.Body, err)
	_, err = tasks.Open(keys, "another-task", task.Type(), task.Payload(), false)
	fmt.Println(err)

	_, err = tasks.NewTask(tasks.NewEmail("acme", "ann@example.com", "Hi\r\nBcc: all@example.com", "..."), keys)
	fmt.Println(err)
	// Output:
	// notify:sms
	// true false
	// +14155550100 Your code is 123456 <nil>
	// sealed payload does not open: key "k1": wrong key, damaged, or sealed for another task
	// invalid notification: subject contains a line break or control character (header injection)
}
