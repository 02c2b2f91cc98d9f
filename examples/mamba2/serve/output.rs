//! A request's text as its tokens arrive: decoded incrementally (text that later tokens could
//! still change is held back), cut at the first stop sequence or stop token (the checkpoint's
//! end-of-turn tokens, not returned), and never split inside a possible stop sequence.

use anyhow::Result;

use crate::text::Codec;

/// The text of one request so far.
pub(crate) struct Output {
    stops: Vec<String>,
    stop_ids: Vec<u32>,
    ids: Vec<u32>,
    /// Bytes of the text already handed out.
    sent: usize,
    /// The text ended at a stop sequence.
    stopped: bool,
}

impl Output {
    pub(crate) fn new(stops: Vec<String>, stop_ids: Vec<u32>) -> Self {
        Output {
            stops,
            stop_ids,
            ids: Vec::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// Adds `tokens`; returns the text that is now final (possibly empty). After a stop
    /// sequence or a stop token, [`Output::stopped`] is true and nothing more is returned.
    pub(crate) fn push(&mut self, codec: &Codec, tokens: &[u32]) -> Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        let cut = tokens.iter().position(|t| self.stop_ids.contains(t));
        self.ids
            .extend_from_slice(&tokens[..cut.unwrap_or(tokens.len())]);
        if cut.is_some() {
            let text = codec.decode(&self.ids)?.unwrap_or_default();
            let piece = self.release(&text, true);
            self.stopped = true;
            return Ok(piece);
        }
        let text = codec.decode_settled(&self.ids)?.unwrap_or_default();
        Ok(self.release(&text, false))
    }

    /// The text still held back, at the end of the request.
    pub(crate) fn finish(&mut self, codec: &Codec) -> Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        let text = codec.decode(&self.ids)?.unwrap_or_default();
        Ok(self.release(&text, true))
    }

    /// Whether the text ended at a stop sequence.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// The tokens so far.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The part of `text` after what was sent that is final: up to a stop sequence (then
    /// stopped), else all of it at the end, else all but a tail that could begin one.
    fn release(&mut self, text: &str, end: bool) -> String {
        // A tokenizer may rewrite the last characters as tokens arrive; what was sent stays.
        let sent = floor_boundary(text, self.sent.min(text.len()));
        let from = floor_boundary(text, sent.saturating_sub(self.longest_stop()));
        let hit = self
            .stops
            .iter()
            .filter_map(|s| text[from..].find(s.as_str()).map(|at| from + at))
            .min();
        let upto = match hit {
            Some(at) => {
                self.stopped = true;
                at.max(sent)
            }
            None if end => text.len(),
            None => text.len() - self.open_stop_tail(&text[sent..]),
        };
        let piece = text[sent..upto].to_string();
        self.sent = upto;
        piece
    }

    fn longest_stop(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }

    /// The length of the longest tail of `text` that is a proper prefix of a stop sequence.
    fn open_stop_tail(&self, text: &str) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for len in (1..stop.len().min(text.len() + 1)).rev() {
                let at = text.len() - len;
                if text.is_char_boundary(at) && stop.starts_with(&text[at..]) {
                    best = best.max(len);
                    break;
                }
            }
        }
        best
    }
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::bytes_to_ids;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let codec = Codec::Text(stablegraph::models::Text::Bytes);
        let mut out = Output::new(stops, Vec::new());
        let mut sent: Vec<String> = pieces
            .iter()
            .map(|p| out.push(&codec, &bytes_to_ids(p.as_bytes())).unwrap())
            .collect();
        sent.push(out.finish(&codec).unwrap());
        (sent, out.stopped())
    }

    #[test]
    fn text_stops_before_a_stop_sequence_split_over_pieces() {
        let (sent, stopped) = run(&["\n\n"], &["ab\n", "\ncd"]);
        assert_eq!(sent, ["ab", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn a_possible_stop_prefix_is_held_until_it_is_not_one() {
        let (sent, stopped) = run(&["END"], &["xE", "Ny", "z"]);
        assert_eq!(sent, ["x", "ENy", "z", ""]);
        assert!(!stopped);
    }

    #[test]
    fn an_incomplete_character_waits_for_its_bytes() {
        let e = "é".as_bytes();
        let codec = Codec::Text(stablegraph::models::Text::Bytes);
        let mut out = Output::new(Vec::new(), Vec::new());
        assert_eq!(
            out.push(&codec, &[u32::from(b'a'), u32::from(e[0])])
                .unwrap(),
            "a"
        );
        assert_eq!(out.push(&codec, &[u32::from(e[1])]).unwrap(), "é");
        assert_eq!(out.finish(&codec).unwrap(), "");
    }

    #[test]
    fn a_stop_token_ends_the_text_without_itself() {
        let codec = Codec::Text(stablegraph::models::Text::Bytes);
        let mut out = Output::new(Vec::new(), vec![u32::from(b'|')]);
        assert_eq!(out.push(&codec, &bytes_to_ids(b"ab|cd")).unwrap(), "ab");
        assert!(out.stopped());
        assert_eq!(out.ids(), bytes_to_ids(b"ab"));
        assert_eq!(out.push(&codec, &bytes_to_ids(b"ef")).unwrap(), "");
    }
}
