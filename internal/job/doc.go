// Package job owns llmq's domain: the job message of the queue contract, its
// validation, the public statuses and the one transition table through which
// every state change in llmq goes. It imports nothing internal.
package job
