-- Nexmark q7 as the nexmark project writes it for Flink SQL (github.com/nexmark/nexmark,
-- nexmark-flink/src/main/resources/queries/q7.sql at 6b3646c, Apache License 2.0): the query
-- of its INSERT, unchanged.
SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
from bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end as `dateTime`
  FROM TABLE(
          TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime`  - INTERVAL '10' SECOND AND B1.`dateTime`;
