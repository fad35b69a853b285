-- Nexmark q2 as the nexmark project writes it for Flink SQL (github.com/nexmark/nexmark,
-- nexmark-flink/src/main/resources/queries/q2.sql at 6b3646c, Apache License 2.0): the query
-- of its INSERT, unchanged.
SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
