-- Nexmark q0 as the nexmark project writes it for Flink SQL (github.com/nexmark/nexmark,
-- nexmark-flink/src/main/resources/queries/q0.sql at 6b3646c, Apache License 2.0): the query
-- of its INSERT, unchanged.
SELECT auction, bidder, price, `dateTime`, extra FROM bid;
