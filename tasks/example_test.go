package tasks_test

import (
	"fmt"

	"github.com/sluicehq/sluice/tasks"
)

// Build the task a producer enqueues. The notification id is the task id,
// so enqueueing the same id twice is refused (tasks.ErrDuplicate).
func ExampleNewTask() {
	n := tasks.NewSMS("acme", "+1 (415) 555-0100", "Your code is 123456")
	n.ID = "0190a5e2-7c1e-7d4e-9a3b-2f1c0d9e8b7a" // normally left to NewSMS (a UUIDv7)
	task, err := tasks.NewTask(n)
	if err != nil {
		fmt.Println("invalid:", err)
		return
	}
	fmt.Println(task.Type())
	fmt.Println(string(task.Payload()))

	_, err = tasks.NewTask(tasks.NewEmail("acme", "ann@example.com", "Hi\r\nBcc: all@example.com", "..."))
	fmt.Println(err)
	// Output:
	// notify:sms
	// {"id":"0190a5e2-7c1e-7d4e-9a3b-2f1c0d9e8b7a","tenant":"acme","channel":"sms","to":"+14155550100","body":"Your code is 123456"}
	// invalid notification: subject contains a line break or NUL (header injection)
}
