//! Stop strings on streamed text: release text as it comes, except what could still become a
//! stop string.
//!
//! Invariants: no text at or past the first stop string is ever released; a stop string split
//! across pushes is never released in part, because any suffix of the unreleased text that is
//! a prefix of some stop string is held back; everything else is released at once (the held
//! part is at most the longest stop string minus one byte). Matching is on `&str`, so a cut
//! never falls inside a character.
//! Why holding the longest such suffix suffices: if a stop string later completes starting at
//! byte p, the text from p to the end was, at every earlier push, a prefix of it, so p lay in
//! the held suffix each time, never in released text.
//! Rejected: matching on token ids (`stop` is text; a string can span tokens and one token can
//! hold text before and after a stop string).

/// The stop-string state of one generation.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text pushed but not released (a possible start of a stop string).
    held: String,
    /// Length of the longest stop string, bytes.
    longest: usize,
}

/// What a push releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// Text safe to send; generation goes on.
    Text(String),
    /// A stop string matched: the text before it, and generation ends.
    Stopped(String),
}

impl StopMatcher {
    /// `stops` must not hold an empty string (validation refuses those).
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher { stops, held: String::new(), longest }
    }

    /// Adds newly decoded text.
    pub fn push(&mut self, text: &str) -> Released {
        if self.stops.is_empty() {
            return Released::Text(text.to_string());
        }
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let before = self.held[..at].to_string();
            self.held.clear();
            return Released::Stopped(before);
        }
        let keep_from = self.hold_from();
        let released: String = self.held.drain(..keep_from).collect();
        Released::Text(released)
    }

    /// Releases what is held (generation ended without completing a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Start of the longest suffix of `held` that is a proper prefix of some stop string
    /// (`held.len()` if none). No match is complete here (`push` checked), so only the last
    /// `longest - 1` bytes can start one.
    fn hold_from(&self) -> usize {
        let len = self.held.len();
        let from = len.saturating_sub(self.longest.saturating_sub(1));
        (from..len)
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes pieces; returns everything released and whether a stop string matched.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = matcher(stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                Released::Text(t) => out.push_str(&t),
                Released::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_never_released() {
        let mut m = matcher(&["</end>"]);
        assert_eq!(m.push("Hello </"), Released::Text("Hello ".into()));
        assert_eq!(m.push("en"), Released::Text(String::new()));
        assert_eq!(m.push("d> after"), Released::Stopped(String::new()));
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("ST"), Released::Text(String::new()));
        assert_eq!(m.push("ART"), Released::Text("START".into()));
        assert_eq!(m.push("x S"), Released::Text("x ".into()));
        assert_eq!(m.flush(), "S");
    }

    #[test]
    fn text_before_the_stop_in_the_same_piece_is_released() {
        assert_eq!(run(&["\n\n"], &["one\n", "\ntwo"]), ("one".into(), true));
        assert_eq!(run(&["cat"], &["concatenate"]), ("con".into(), true));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["world", "lo w"], &["hel", "lo world"]), ("hel".into(), true));
        assert_eq!(run(&["bb", "abc"], &["xa", "bc"]), ("x".into(), true));
    }

    #[test]
    fn overlapping_prefixes_are_held_until_decided() {
        // "aab": after "aa" both "aa" (suffix) and "a" could start it.
        assert_eq!(run(&["aab"], &["a", "a", "a", "b", "c"]), ("a".into(), true));
        assert_eq!(run(&["aab"], &["a", "a", "a", "c"]), ("aaac".into(), false));
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["日本"], &["こんにちは日", "本語"]), ("こんにちは".into(), true));
        assert_eq!(run(&["日本"], &["日", "曜"]), ("日曜".into(), false));
    }

    #[test]
    fn without_stops_everything_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    /// Every way of cutting a text into pieces releases the same text: the part before the
    /// first stop string, found by `str::find` on the whole text.
    #[test]
    fn released_text_does_not_depend_on_how_the_text_is_cut() {
        let text = "xx ab abc aabcd abcde done";
        let stops = ["abcd", "bcde", "cdx"];
        let first = stops.iter().filter_map(|s| text.find(s)).min().unwrap();
        let want = (text[..first].to_string(), true);
        for a in 0..text.len() {
            for b in a..text.len() {
                let pieces = [&text[..a], &text[a..b], &text[b..]];
                assert_eq!(run(&stops, &pieces), want, "cut at {a}, {b}");
            }
        }
    }
}
