package bert

// GPU gives the model's shape, pooling and float32 weights in the form the
// CUDA encoder (NewCUDAEncoder) uploads. The slices are the model's own:
// the caller must not change them.
func (m *Model) GPU() (GPUConfig, *GPUWeights) {
	c := GPUConfig{
		Vocab:        m.cfg.VocabSize,
		Hidden:       m.cfg.HiddenSize,
		Layers:       m.cfg.NumLayers,
		Heads:        m.cfg.NumHeads,
		Intermediate: m.cfg.IntermediateSize,
		MaxPositions: m.cfg.MaxPositionEmbeddings,
		LayerNormEps: m.cfg.LayerNormEps,
		Normalize:    m.sentence.Normalize,
		MaxSeqLength: m.sentence.MaxSeqLength,
	}
	switch m.sentence.Pooling {
	case PoolCLS:
		c.Pooling = GPUPoolCLS
	case PoolMax:
		c.Pooling = GPUPoolMax
	default:
		c.Pooling = GPUPoolMean
	}
	w := m.w
	gw := &GPUWeights{Word: w.word, Pos: w.pos, TokenType0: w.tokenType0, EmbLNGamma: w.embLN.gamma, EmbLNBeta: w.embLN.beta}
	for _, l := range w.layers {
		gw.Layers = append(gw.Layers, GPULayerWeights{
			QKVW: l.qkvW, QKVB: l.qkvB, AttnOutW: l.attnOutW, AttnOutB: l.attnOutB,
			AttnLNGamma: l.attnLN.gamma, AttnLNBeta: l.attnLN.beta,
			InterW: l.interW, InterB: l.interB, OutW: l.outW, OutB: l.outB,
			OutLNGamma: l.outLN.gamma, OutLNBeta: l.outLN.beta,
		})
	}
	return c, gw
}

// WithSentence is a copy of the model that pools and normalizes as s says
// (the weights are shared), for comparing every pooling on one checkpoint.
func (m *Model) WithSentence(s Sentence) *Model {
	c := *m
	c.sentence = s
	return &c
}
