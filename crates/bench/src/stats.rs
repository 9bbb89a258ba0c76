//! Summaries of measured times.

/// The `q` quantile (0 to 1) of times sorted ascending, by the nearest rank; NaN when
/// there are none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let times = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&times, 0.0), 1.0);
        assert_eq!(percentile(&times, 0.5), 3.0);
        assert_eq!(percentile(&times, 1.0), 5.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
