//! Key popularity: `--key-dist uniform|zipf:S`.
//!
//! The Zipf sampler is rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion
//! to generate variates from monotone discrete distributions", 1996): O(1) memory and time per
//! sample for any number of keys, exact for every exponent `s > 0` (including 1). Rank 1 (key
//! 0) is the most popular: P(rank k) is proportional to `k^-s`.

use crate::mix::XorShift;

/// How `{key}` (and the kvcache prompts) pick an index in `0..n`.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDist {
    Uniform,
    Zipf(f64),
}

impl KeyDist {
    /// `uniform` or `zipf:S`, S a finite exponent in (0, 10].
    pub fn parse(s: &str) -> Result<KeyDist, String> {
        if s == "uniform" {
            return Ok(KeyDist::Uniform);
        }
        let bad = || {
            format!(
                "invalid --key-dist {s:?}: expected uniform or zipf:S (S in (0, 10], e.g. zipf:0.99)"
            )
        };
        let exp = s.strip_prefix("zipf:").ok_or_else(bad)?;
        let e: f64 = exp.parse().map_err(|_| bad())?;
        if !(e.is_finite() && e > 0.0 && e <= 10.0) {
            return Err(bad());
        }
        Ok(KeyDist::Zipf(e))
    }

    /// The sampler for indices in `0..n` (n ≥ 1).
    pub fn sampler(&self, n: u64) -> Sampler {
        match self {
            KeyDist::Uniform => Sampler::Uniform(n.max(1)),
            KeyDist::Zipf(s) => Sampler::Zipf(Zipf::new(n.max(1), *s)),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Sampler {
    Uniform(u64),
    Zipf(Zipf),
}

impl Sampler {
    /// An index in `0..n`.
    pub fn sample(&self, rng: &mut XorShift) -> u64 {
        match self {
            Sampler::Uniform(n) => rng.next() % n,
            Sampler::Zipf(z) => z.sample(rng) - 1,
        }
    }
}

/// A uniform f64 in [0, 1) from 53 random bits.
pub fn unit(rng: &mut XorShift) -> f64 {
    (rng.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Zipf over ranks `1..=n` with exponent `s`.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    pub fn new(n: u64, s: f64) -> Zipf {
        let mut z = Zipf {
            n: n as f64,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.threshold = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// A rank in `1..=n`.
    pub fn sample(&self, rng: &mut XorShift) -> u64 {
        loop {
            let u = self.h_integral_n + unit(rng) * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// h(x) = x^-s, the unnormalised density.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// H(x) = ∫ h, written to stay exact as s → 1: (x^(1-s) - 1) / (1 - s).
    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        expm1_over_x((1.0 - self.s) * lx) * lx
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }
}

/// (e^x - 1) / x, 1 at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// ln(1 + x) / x, 1 at 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson's chi-square statistic of `counts` against probabilities `p`.
    fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
        let total: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .map(|(&o, &p)| {
                let e = p * total as f64;
                (o as f64 - e).powi(2) / e
            })
            .sum()
    }

    fn zipf_probabilities(n: usize, s: f64) -> Vec<f64> {
        let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
        let sum: f64 = w.iter().sum();
        w.iter().map(|x| x / sum).collect()
    }

    fn counts(sampler: &Sampler, n: usize, draws: usize, seed: u64) -> Vec<u64> {
        let mut rng = XorShift::new(seed);
        let mut c = vec![0u64; n];
        for _ in 0..draws {
            let i = sampler.sample(&mut rng);
            assert!((i as usize) < n, "{i} out of 0..{n}");
            c[i as usize] += 1;
        }
        c
    }

    /// Chi-square critical value at significance 0.001 for 99 degrees of freedom (100 bins).
    const CHI2_99_DF_P001: f64 = 148.23;

    #[test]
    fn zipf_matches_its_distribution_chi_square() {
        for s in [0.5, 0.99, 1.0, 1.2, 2.0] {
            let sampler = KeyDist::Zipf(s).sampler(100);
            let c = counts(&sampler, 100, 200_000, 7);
            let chi = chi_square(&c, &zipf_probabilities(100, s));
            assert!(chi < CHI2_99_DF_P001, "s={s}: chi-square {chi:.1}");
        }
        // The check can fail: uniform draws are far from Zipf, and Zipf(1.2) from Zipf(0.99).
        let uniform = counts(&KeyDist::Uniform.sampler(100), 100, 200_000, 7);
        assert!(chi_square(&uniform, &zipf_probabilities(100, 0.99)) > 10.0 * CHI2_99_DF_P001);
        let z12 = counts(&KeyDist::Zipf(1.2).sampler(100), 100, 200_000, 7);
        assert!(chi_square(&z12, &zipf_probabilities(100, 0.99)) > CHI2_99_DF_P001);
        // Uniform is uniform.
        let chi = chi_square(&uniform, &[0.01; 100]);
        assert!(chi < CHI2_99_DF_P001, "uniform: chi-square {chi:.1}");
    }

    #[test]
    fn zipf_is_deterministic_and_bounded_for_huge_key_spaces() {
        let z = KeyDist::Zipf(0.99).sampler(1 << 40);
        let a = counts_vec(&z, 3);
        assert_eq!(a, counts_vec(&z, 3), "same seed, same keys");
        assert_ne!(a, counts_vec(&z, 4));
        assert!(a.iter().all(|&k| k < 1 << 40));
        // One key only.
        let one = KeyDist::Zipf(1.5).sampler(1);
        let mut rng = XorShift::new(1);
        assert!((0..100).all(|_| one.sample(&mut rng) == 0));
    }

    fn counts_vec(s: &Sampler, seed: u64) -> Vec<u64> {
        let mut rng = XorShift::new(seed);
        (0..1000).map(|_| s.sample(&mut rng)).collect()
    }

    #[test]
    fn parses() {
        assert_eq!(KeyDist::parse("uniform"), Ok(KeyDist::Uniform));
        assert_eq!(KeyDist::parse("zipf:0.99"), Ok(KeyDist::Zipf(0.99)));
        for bad in [
            "zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:nan", "zipf:11", "normal",
        ] {
            assert!(KeyDist::parse(bad).is_err(), "{bad}");
        }
    }
}
