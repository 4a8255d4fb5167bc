//! The seam between a face and what its client reads: every face (a
//! one-shot, `--batch`, the server) hands one job's events to a [`Print`]
//! and finishes it, and never writes an answer's bytes itself. Which one a
//! job gets is its client's choice; the binary's `print::open` makes it.
//! A new answer shape (another API's objects and events) is one more
//! implementation.

use crate::backend::Event;
use crate::chat_printer::ChatWriter;
use crate::error::Result;
use crate::printer::Printer;
use std::io::Write;

/// Writes one job's answer as its events come.
pub trait Print {
    /// Writes what `event` adds (another job's events are not its own). A
    /// rejection is the face's to answer: each face has its own way to
    /// say an error (an exit code, an HTTP status, a batch's error line).
    fn event(&mut self, event: Event) -> Result<()>;
    /// After the job's last event: a stream's end marker, a terminal's
    /// last newline, a whole answer's bytes sent on.
    fn finish(&mut self) -> Result<()>;
    /// After an interruption or an error: what was written stays whole.
    fn abort(&mut self) {}
}

impl<W: Write> Print for Printer<W> {
    fn event(&mut self, event: Event) -> Result<()> {
        Printer::event(self, event)
    }

    fn finish(&mut self) -> Result<()> {
        Printer::finish(self)
    }

    fn abort(&mut self) {
        Printer::abort(self)
    }
}

impl<W: Write> Print for ChatWriter<W> {
    fn event(&mut self, event: Event) -> Result<()> {
        ChatWriter::event(self, event)
    }

    fn finish(&mut self) -> Result<()> {
        ChatWriter::finish(self)
    }
}
