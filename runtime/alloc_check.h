// Checks of a graph allocator's plan, for tests, benchmarks and debugging.
//
//   galloc.alloc_graph(g);
//   std::string problems = check_plan(g, galloc);   // "" when the plan is sound
//   size_t lower = live_peak(g, galloc)[0];          // no plan can use less than this
#pragma once

#include <string>
#include <vector>

#include "runtime/graph.h"
#include "runtime/graph_allocator.h"

namespace troupe {

// Checks the planner's invariants for g after galloc.alloc_graph(g); returns "" or what is wrong:
//  - every node and leaf has memory;
//  - two tensors planned into overlapping bytes of the same chunk are never alive at once, except a node
//    computed in place over a parent whose last use it is;
//  - every tensor lies inside its chunk's first max(max_size, largest tensor of the chunk) bytes (the last
//    chunk may grow without bound).
std::string check_plan(const graph& g, const graph_allocator& galloc);

// The peak of simultaneously live bytes per buffer type (a lower bound for any plan), by the same liveness.
std::vector<size_t> live_peak(const graph& g, const graph_allocator& galloc);

}  // namespace troupe
