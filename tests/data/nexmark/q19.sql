-- Nexmark q19 as the nexmark project writes it for Flink SQL (github.com/nexmark/nexmark,
-- nexmark-flink/src/main/resources/queries/q19.sql at 6b3646c, Apache License 2.0): the query
-- of its INSERT, unchanged.
SELECT * FROM
(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
WHERE rank_number <= 10;
