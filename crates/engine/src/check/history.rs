//! The teacher-forced token history the checks run on: the model's tokenization of a fixed
//! English passage (so attention sees realistic patterns and sampling has a real
//! distribution), extended with seeded pseudo-random ids when more tokens are asked for.
//!
//! The passage is original text written for this purpose. The engine has no tokenizer; the
//! caller tokenizes [`PASSAGE`] and hands the ids to [`history`].

use super::rng::Rng;

/// About 450 tokens of plain prose for most BPE vocabularies.
pub const PASSAGE: &str = "\
The lighthouse keeper kept a notebook in which he wrote down, every evening, the direction of \
the wind, the height of the swell and the names of the ships that passed before dark. Most \
entries were short. A fishing boat from the northern harbour, two cargo vessels bound for the \
river mouth, a yacht with a torn sail that had turned back before the headland. On calm days \
he added a line about the birds: the gulls that followed the boats, the cormorants drying \
their wings on the rocks below the tower, and once, late in autumn, a flock of geese so large \
that it took several minutes to pass overhead.\n\n\
The notebook was not required by anyone. The harbour office received its reports by radio, \
and the weather service had its own instruments on the roof. He kept it because his \
predecessor had kept one, and the one before her, and the shelf in the store room held \
forty-three of them, bound in the same grey cloth, going back to the year the lamp was first \
lit. Reading them in the winter, when the evenings were long, he noticed how the handwriting \
changed from one keeper to the next while the sentences stayed almost the same: wind from the \
west, moderate sea, visibility good, nothing to report.\n\n\
In the spring a student came from the university to study the old records. She photographed \
every page, typed the numbers into a table and, after some weeks, showed him a chart on which \
a century of storms rose and fell like the tide itself. Some years were quiet and some were \
wild, but the wild years had become more frequent, and the quiet ones shorter. He looked at \
the chart for a long time. Then he asked whether she would like to see the lamp, and they \
climbed the hundred and twelve steps together, counting them aloud, as visitors always did.\n\n\
That evening he wrote the usual lines about the wind and the sea, and then, after a moment, \
one more: a student from the city, who found in our notebooks what none of us had noticed, \
because each of us had only ever read our own.";

/// `n` tokens: `text` (the passage's ids) truncated, or extended with ids below `vocab` drawn
/// from `seed`.
pub fn history(text: &[u32], n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut out: Vec<u32> = text.iter().copied().take(n).collect();
    let mut rng = Rng::derive(seed, "history");
    while out.len() < n {
        out.push(rng.below(vocab.max(1)) as u32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_or_extends() {
        assert_eq!(history(&[5, 6, 7], 2, 10, 0), [5, 6]);
        let h = history(&[5, 6, 7], 40, 10, 1);
        assert_eq!(h.len(), 40);
        assert_eq!(&h[..3], &[5, 6, 7]);
        assert!(h.iter().all(|&t| t < 10));
        assert_eq!(h, history(&[5, 6, 7], 40, 10, 1));
        assert_ne!(h, history(&[5, 6, 7], 40, 10, 2));
    }
}
