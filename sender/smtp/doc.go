// Package smtp is the email provider that sends over SMTP
// (SLUICE_EMAIL_SENDER=smtp; Provider is its entry in sender/providers).
//
// A Sender keeps up to SLUICE_SMTP_CONNECTIONS connections open and reuses
// them, dialling lazily, with STARTTLS required, opportunistic, implicit
// TLS or none (SLUICE_SMTP_TLS) and AUTH only where it cannot reveal the
// password unless SLUICE_SMTP_ALLOW_PLAIN_AUTH says so. Message renders a
// notification as the email Send sends (multipart/alternative with HTML,
// List-Unsubscribe folded and with RFC 8058's One-Click post, the custom
// headers); with DKIM (DKIMConfig, SLUICE_DKIM_*) go-mail renders it,
// go-msgauth signs those bytes, and exactly the signed bytes are sent.
//
// # What a refusal means
//
// Send returns a *sender.SendError the worker acts on: a 5xx reply is
// permanent and a 4xx transient, both meaning the server did not take the
// message (NotSent: its quota slot is given back); 421, 451, 452 and 454
// are the relay throttling (Throttled: every worker holds the provider);
// a 5xx to RCPT TO, or 550, 551 or 553 at the end of DATA, is a hard
// bounce (Suppress: the address is marked undeliverable in package
// consent). An error without a reply is transient, and not-sent only when
// it came before the message could have been taken.
package smtp
