-- Nexmark q13 as the nexmark project writes it for Flink SQL (github.com/nexmark/nexmark,
-- nexmark-flink/src/main/resources/queries/q13.sql at 6b3646c, Apache License 2.0): the query
-- of its INSERT, unchanged.
SELECT
    B.auction,
    B.bidder,
    B.price,
    B.`dateTime`,
    S.`value`
FROM (SELECT *, PROCTIME() as p_time FROM bid) B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S
ON mod(B.auction, 10000) = S.key;
